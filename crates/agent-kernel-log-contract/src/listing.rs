//! The saga list an operator reads: counts by state, and pages under filters.

use agent_kernel_api::{SagaQuery, SagaState};

use crate::LogStore;
use crate::records::{begin_on, new_saga};

/// Checks that sagas are counted by state, for an operator's overview.
pub async fn sagas_are_counted_by_state(store: &dyn LogStore) {
    let log = store.open();
    assert!(log.saga_counts().await.expect("counts").is_empty());
    let mut batch = crate::records::done_saga_declaring("a");
    batch.extend(crate::records::done_saga_declaring("b"));
    batch.extend([new_saga("c"), begin_on("c", 0, &["file:/w/c"], &[])]);
    log.write(batch).await.expect("writes");
    let mut counts = log.saga_counts().await.expect("counts");
    counts.sort_by_key(|(state, _)| state.as_str());
    assert_eq!(counts, [(SagaState::Acting, 1), (SagaState::Done, 2)]);
}

/// Checks that a page of the saga list holds what its filters select, newest first, and
/// that the next page starts after the last.
pub async fn sagas_are_listed_by_page_and_filter(store: &dyn LogStore) {
    let log = store.open();
    // a, b and c begin a step each (c's arguments `{"n": 0}` under another tool); a and b
    // are done.
    let mut batch = crate::records::done_saga_declaring("a");
    batch.extend(crate::records::done_saga_declaring("b"));
    batch.extend([new_saga("c"), begin_on("c", 0, &["file:/w/c"], &[])]);
    log.write(batch).await.expect("writes");
    let ids = |page: &[agent_kernel_api::SagaListing]| -> Vec<String> {
        page.iter()
            .map(|listing| listing.saga.saga_id.as_str().to_owned())
            .collect()
    };
    let all = log
        .saga_page(&SagaQuery {
            limit: 10,
            ..SagaQuery::default()
        })
        .await
        .expect("lists");
    assert_eq!(all.len(), 3);
    assert_eq!(
        all.iter()
            .find(|l| l.saga.saga_id.as_str() == "a")
            .expect("a")
            .n_begun,
        2
    );
    let first = log
        .saga_page(&SagaQuery {
            limit: 2,
            ..SagaQuery::default()
        })
        .await
        .expect("lists");
    assert_eq!(ids(&first), ids(&all[..2]));
    let last = &first[1].saga;
    let rest = log
        .saga_page(&SagaQuery {
            limit: 2,
            before: Some((last.created_at_ms, last.saga_id.clone())),
            ..SagaQuery::default()
        })
        .await
        .expect("lists");
    assert_eq!(ids(&rest), ids(&all[2..]));
    let done = log
        .saga_page(&SagaQuery {
            state: Some(SagaState::Done),
            limit: 10,
            ..SagaQuery::default()
        })
        .await
        .expect("lists");
    let mut done_ids = ids(&done);
    done_ids.sort();
    assert_eq!(done_ids, ["a", "b"]);
    // Every step's arguments are `{"path": "a.txt", "content": "x"}`, of `fs.write`.
    for (text, expected) in [
        ("A.TXT", 3),
        ("\"content\"", 3),
        ("%", 0),
        ("_", 0),
        ("zzz", 0),
    ] {
        let found = log
            .saga_page(&SagaQuery {
                text: Some(text.to_owned()),
                limit: 10,
                ..SagaQuery::default()
            })
            .await
            .expect("lists");
        assert_eq!(found.len(), expected, "{text}: {:?}", ids(&found));
    }
    for (tool, actor, expected) in [
        (Some("fs.write"), None, 3),
        (Some("fs.delete"), None, 0),
        (None, Some("nobody"), 0),
    ] {
        let found = log
            .saga_page(&SagaQuery {
                tool: tool.map(str::to_owned),
                actor: actor.map(str::to_owned),
                limit: 10,
                ..SagaQuery::default()
            })
            .await
            .expect("lists");
        assert_eq!(found.len(), expected, "{tool:?} {actor:?}");
    }
    // Every saga is named `n`; the window is on creation, its start in and its end out.
    let first_ms = all
        .iter()
        .map(|l| l.saga.created_at_ms)
        .min()
        .expect("some");
    let last_ms = all
        .iter()
        .map(|l| l.saga.created_at_ms)
        .max()
        .expect("some");
    for (name, from_ms, until_ms, expected) in [
        (Some("n"), None, None, 3),
        (Some("m"), None, None, 0),
        (None, Some(first_ms), None, 3),
        (None, Some(last_ms + 1), None, 0),
        (None, None, Some(first_ms), 0),
        (Some("n"), Some(first_ms), Some(last_ms + 1), 3),
    ] {
        let found = log
            .saga_page(&SagaQuery {
                name: name.map(str::to_owned),
                created_from_ms: from_ms,
                created_until_ms: until_ms,
                limit: 10,
                ..SagaQuery::default()
            })
            .await
            .expect("lists");
        assert_eq!(found.len(), expected, "{name:?} {from_ms:?} {until_ms:?}");
    }
}

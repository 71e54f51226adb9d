//! The kernel's file access for tools of the program's own (`SandboxFiles`): what a write
//! cut short by a crash leaves is removed by the step's next write or removal of that file.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use agent_kernel_sandbox::{FsSandbox, Policy};
use agent_kernel_tools::SandboxFiles;

/// A context for step `step_seq` whose file access is confined to `base/workspace`.
fn confined(base: &Path, step_seq: u32) -> agent_kernel_api::ToolContext {
    let policy = Policy::from_toml_str("[fs]\nallow = [\"workspace\"]\n", base).expect("policy");
    let sandbox = Arc::new(FsSandbox::new(&policy).expect("sandbox"));
    let mut ctx = crate::ctx("own.tool", step_seq);
    ctx.files = Arc::new(SandboxFiles::new(sandbox, base.to_path_buf()));
    ctx
}

/// The temporary file a write of `ctx`'s step to `workspace/NAME` left when it was cut
/// short, planted with junk.
fn leftover(base: &Path, ctx: &agent_kernel_api::ToolContext, name: &str) -> std::path::PathBuf {
    let temp =
        base.join("workspace")
            .join(SandboxFiles::temp_name(&ctx.saga_id, ctx.step_seq, name));
    fs::write(&temp, "half a write").expect("plants the leftover");
    temp
}

#[tokio::test]
async fn a_write_cut_short_leaves_a_name_the_steps_next_write_or_removal_clears() {
    let fixture = crate::Fixture::new();
    let base = &fixture.base;
    let ctx = confined(base, 3);

    // A retried write of the step finds its own leftover: it is cleared, not in the way.
    let temp = leftover(base, &ctx, "kv.txt");
    ctx.write_file("workspace/kv.txt", b"value".to_vec())
        .await
        .expect("writes over its own leftover");
    assert_eq!(
        fs::read(base.join("workspace/kv.txt")).expect("written"),
        b"value"
    );
    assert!(!temp.exists(), "the leftover is gone");

    // The compensation's removal clears it too.
    let temp = leftover(base, &ctx, "kv.txt");
    assert!(ctx.remove_file("workspace/kv.txt").await.expect("removes"));
    assert!(!temp.exists(), "the leftover is gone");
    assert!(!base.join("workspace/kv.txt").exists());

    // Another step's, or another file's, is not this write's to touch.
    let other_step = leftover(base, &confined(base, 4), "kv.txt");
    let other_file = leftover(base, &ctx, "other.txt");
    ctx.write_file("workspace/kv.txt", b"again".to_vec())
        .await
        .expect("writes");
    assert!(other_step.exists() && other_file.exists());
    assert_ne!(
        SandboxFiles::temp_name(&ctx.saga_id, 3, "a.txt"),
        SandboxFiles::temp_name(&ctx.saga_id, 3, "b.txt"),
        "two files of one step never share a temporary name"
    );
}

/// Two writes of one file in one step at once: both succeed, one after the other, and the
/// file holds one of them whole; no temporary file is left.
#[tokio::test]
async fn two_writes_of_one_file_in_one_step_at_once_both_land_whole() {
    let fixture = crate::Fixture::new();
    let base = &fixture.base;
    let ctx = confined(base, 5);
    for _ in 0..20 {
        let (first, second) = tokio::join!(
            ctx.write_file("workspace/kv.txt", vec![b'a'; 40]),
            ctx.write_file("workspace/kv.txt", vec![b'b'; 40]),
        );
        first.expect("the first lands");
        second.expect("the second lands");
        let bytes = fs::read(base.join("workspace/kv.txt")).expect("written");
        assert!(
            bytes == vec![b'a'; 40] || bytes == vec![b'b'; 40],
            "one write whole: {bytes:?}"
        );
    }
    let left: Vec<String> = fs::read_dir(base.join("workspace"))
        .expect("lists")
        .map(|entry| {
            entry
                .expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.starts_with(".agent-kernel-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

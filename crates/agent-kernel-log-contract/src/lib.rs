//! The transaction log's contract as executable checks: one source, run against every
//! backend of [`TxLog`] (the SQLite log in `agent-kernel-txlog`, the PostgreSQL log in
//! `agent-kernel-txlog-postgres`).
//!
//! A backend's test suite implements [`LogStore`] (a fresh, empty log, which it can open
//! several connections to) and expands [`contract_tests!`], which makes one `#[tokio::test]`
//! of each check:
//!
//! ```ignore
//! agent_kernel_log_contract::contract_tests!(crate::fresh_store());
//! ```
//!
//! where `fresh_store()` returns `Option<impl LogStore>`; `None` skips the checks (a
//! backend whose server is not configured), saying so on stderr.

pub mod checks;
pub mod isolation;
pub mod listing;
pub mod postgres;
pub mod records;

use std::sync::Arc;

use agent_kernel_api::TxLog;

/// One empty log for one check, which may be opened more than once (each a connection of
/// its own, with its own writer) to race writers against each other.
pub trait LogStore {
    /// Opens (another connection to) this store's log.
    fn open(&self) -> Arc<dyn TxLog>;

    /// Runs once a check has passed and dropped its logs: a backend's own checks of what
    /// the check left (SQLite verifies the audit chain).
    fn finished(&self) {}

    /// The rows of the log's view `held_locks` (resource, saga), read on a connection of
    /// its own: what an operator's query of the locks held finds, checked against what the
    /// log itself says each saga holds.
    fn held_locks(&self) -> Vec<(String, String)>;
}

/// Expands to one `#[tokio::test]` per check of [`checks`], each on the store `$fresh`
/// makes (an `Option<impl LogStore>`; `None` skips).
#[macro_export]
macro_rules! contract_tests {
    ($fresh:expr) => {
        $crate::contract_tests!(@each $fresh;
            a_saga_round_trips_with_every_field,
            sagas_read_at_once_are_answered_in_the_order_asked,
            a_batch_with_a_bad_record_writes_nothing,
            a_step_begins_only_in_a_saga_that_is_no_dry_run,
            a_step_cannot_be_committed_twice_or_begun_twice,
            keys_are_held_while_live_and_released_after_compensation,
            take_over_is_a_compare_and_swap_on_owner_and_state,
            a_take_over_and_its_batch_are_written_together_or_not_at_all,
            a_key_whose_step_failed_with_an_uncertain_outcome_stays_held,
            a_refused_step_leaves_its_key_alone,
            two_connections_write_one_log_at_once,
            batches_written_at_once_are_each_answered_as_alone,
            a_saga_that_needs_its_actor_idle_is_refused_while_another_is_unfinished,
            duplicate_keys_raced_from_several_connections_are_claimed_once,
            take_over_raced_from_several_connections_succeeds_once,
            a_request_is_decided_once_and_consumed_once_for_its_exact_step,
            dead_letters_count_attempts_and_settle_once,
            a_resource_is_held_by_one_unsettled_saga_until_it_settles,
            an_undo_claims_its_resources_again,
            a_refused_claim_leaves_its_approval_unused,
            a_duplicate_is_found_by_its_keys_within_the_window,
            a_begin_that_repeats_a_step_begun_meanwhile_is_refused,
            duplicate_begins_raced_from_several_connections_are_written_once,
            a_resource_raced_from_several_connections_is_claimed_once,
            a_claim_sees_what_another_connection_claimed_and_settled,
            a_claim_sees_every_claim_other_connections_made_since_it_last_claimed,
            a_refused_step_leaves_its_sagas_earlier_claims_held,
            claims_in_one_batch_see_each_other,
            a_step_refused_by_its_key_claims_nothing,
            sagas_are_counted_by_state,
            sagas_are_listed_by_page_and_filter,
        );
    };
    (@each $fresh:expr; $($check:ident),+ $(,)?) => {
        mod contract {
            $(
                #[tokio::test]
                async fn $check() {
                    match $fresh {
                        Some(store) => {
                            $crate::checks::$check(&store).await;
                            $crate::LogStore::finished(&store);
                        }
                        None => eprintln!("skipped: this backend is not configured"),
                    }
                }
            )+
        }
    };
}

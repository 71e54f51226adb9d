//! Every bound the dispatcher enforces, named, with defaults and per-tool overrides.

use std::collections::BTreeMap;

use agent_kernel_api::UndoWindow;
use serde::Deserialize;

/// Default time a tool call may take, in milliseconds: above the tools' own bounds
/// (`noop` sleeps at most 60 s, `http.get` gives up after 30 s), so those fire first.
pub const DEFAULT_TIMEOUT_MS: u64 = 120_000;
/// Default time a compensation may take, in milliseconds.
pub const DEFAULT_COMPENSATION_TIMEOUT_MS: u64 = 120_000;
/// Longest timeout that may be configured, in milliseconds (one hour).
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;
/// Default number of tool calls running at once, all tools together.
pub const DEFAULT_CONCURRENCY_MAX: usize = 64;
/// Largest concurrency limit that may be configured.
pub const MAX_CONCURRENCY: usize = 4096;
/// Default number of retries of a call that failed with a retriable error.
pub const DEFAULT_RETRIES_MAX: u32 = 2;
/// Largest number of retries that may be configured.
pub const MAX_RETRIES: u32 = 10;
/// Default first backoff between retries, in milliseconds; it doubles per retry.
pub const DEFAULT_BACKOFF_BASE_MS: u64 = 100;
/// Default longest backoff between retries, in milliseconds.
pub const DEFAULT_BACKOFF_MAX_MS: u64 = 5_000;
/// Default number of live sagas one process may hold open at once (reference §8).
pub const DEFAULT_OPEN_SAGAS_MAX: usize = 64;
/// Largest number of open live sagas that may be configured.
pub const MAX_OPEN_SAGAS: usize = 65_536;
/// Default time a live saga may stay untouched before it is rolled back, in milliseconds
/// (ten minutes, reference §8).
pub const DEFAULT_SAGA_IDLE_TIMEOUT_MS: u64 = 600_000;
/// Longest idle timeout of a live saga that may be configured, in milliseconds (a day).
pub const MAX_SAGA_IDLE_TIMEOUT_MS: u64 = 86_400_000;

/// Default time a step waits for a resource another saga holds before it is refused as a
/// conflict, in milliseconds: none, it is refused at once.
pub const DEFAULT_LOCK_WAIT_MS: u64 = 0;
/// Longest lock wait that may be configured, in milliseconds (ten minutes).
pub const MAX_LOCK_WAIT_MS: u64 = 600_000;
/// Default window in which a call of an irreversible tool whose duplicate keys match an
/// earlier step of it needs an approval, in milliseconds (a day).
pub const DEFAULT_DUPLICATE_WINDOW_MS: u64 = 86_400_000;
/// Longest duplicate window that may be configured, in milliseconds (366 days).
pub const MAX_DUPLICATE_WINDOW_MS: u64 = agent_kernel_api::MAX_UNDO_WINDOW_MS;

/// Reads a duration (`24h`) into milliseconds.
fn duration_ms<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let text = String::deserialize(deserializer)?;
    agent_kernel_api::parse_duration_ms(&text)
        .ok_or_else(|| serde::de::Error::custom(agent_kernel_api::not_a_duration(&text)))
}

/// Overrides for one tool; `None` keeps the global value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolLimits {
    /// See [`Limits::timeout_ms`].
    pub timeout_ms: Option<u64>,
    /// How many calls of this tool may run at once (no per-tool limit when `None`).
    pub concurrency_max: Option<usize>,
    /// See [`Limits::retries_max`].
    pub retries_max: Option<u32>,
}

/// The dispatcher's bounds.
///
/// Deserializes from a table such as the `[limits]` section of `sandbox.toml`; every field
/// is optional (the defaults below apply) and unknown fields are errors.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// How long a call (`prepare`, `execute`, `probe`) may take before it fails with an
    /// uncertain outcome.
    pub timeout_ms: u64,
    /// How long a compensation may take before it counts as failed.
    pub compensation_timeout_ms: u64,
    /// How many calls may run at once, all tools together.
    pub concurrency_max: usize,
    /// How many times a call that failed with a retriable error is retried, on idempotent
    /// tools only.
    pub retries_max: u32,
    /// The first backoff between retries; it doubles per retry, plus jitter up to half.
    pub backoff_base_ms: u64,
    /// The longest backoff between retries.
    pub backoff_max_ms: u64,
    /// Per-tool overrides, by tool id.
    pub tools: BTreeMap<String, ToolLimits>,
    /// How many live sagas one process may hold open at once. Not the dispatcher's own
    /// bound: the kernel reads it here, so that `[limits]` is parsed in one place.
    pub open_sagas_max: usize,
    /// How long a live saga may stay untouched before the process holding it rolls it back,
    /// in milliseconds. Read by the kernel, like `open_sagas_max`.
    pub saga_idle_timeout_ms: u64,
    /// How long after its commit a step of a tool that declares no window of its own may
    /// still be undone (`undo_window = "7d"`, reference §10). Read by the kernel.
    pub undo_window: UndoWindow,
    /// How long a step waits for a resource another unsettled saga holds before it is
    /// refused as a conflict (`lock_wait_ms`, 0: refused at once). Read by the kernel.
    pub lock_wait_ms: u64,
    /// How far back a call of a tool of reversibility `none` or `partial` is compared with
    /// the tool's earlier steps for a duplicate (`duplicate_window = "24h"`; `"0s"` turns
    /// the check off). Read by the kernel.
    #[serde(rename = "duplicate_window", deserialize_with = "duration_ms")]
    pub duplicate_window_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            timeout_ms: DEFAULT_TIMEOUT_MS,
            compensation_timeout_ms: DEFAULT_COMPENSATION_TIMEOUT_MS,
            concurrency_max: DEFAULT_CONCURRENCY_MAX,
            retries_max: DEFAULT_RETRIES_MAX,
            backoff_base_ms: DEFAULT_BACKOFF_BASE_MS,
            backoff_max_ms: DEFAULT_BACKOFF_MAX_MS,
            tools: BTreeMap::new(),
            open_sagas_max: DEFAULT_OPEN_SAGAS_MAX,
            saga_idle_timeout_ms: DEFAULT_SAGA_IDLE_TIMEOUT_MS,
            undo_window: UndoWindow::default(),
            lock_wait_ms: DEFAULT_LOCK_WAIT_MS,
            duplicate_window_ms: DEFAULT_DUPLICATE_WINDOW_MS,
        }
    }
}

impl Limits {
    /// Checks every value against its bound.
    ///
    /// # Errors
    ///
    /// [`DispatchError::Limits`](crate::DispatchError::Limits) naming the first setting out
    /// of range.
    pub fn validate(&self) -> Result<(), crate::DispatchError> {
        self.first_out_of_range()
            .map_err(crate::DispatchError::Limits)
    }

    fn first_out_of_range(&self) -> Result<(), String> {
        let check_timeout = |name: &str, value: u64| {
            if value == 0 || value > MAX_TIMEOUT_MS {
                Err(format!(
                    "{name} is {value}, expected 1..={MAX_TIMEOUT_MS} ms"
                ))
            } else {
                Ok(())
            }
        };
        let check_concurrency = |name: &str, value: usize| {
            if value == 0 || value > MAX_CONCURRENCY {
                Err(format!("{name} is {value}, expected 1..={MAX_CONCURRENCY}"))
            } else {
                Ok(())
            }
        };
        let check_retries = |name: &str, value: u32| {
            if value > MAX_RETRIES {
                Err(format!("{name} is {value}, expected 0..={MAX_RETRIES}"))
            } else {
                Ok(())
            }
        };
        check_timeout("timeout_ms", self.timeout_ms)?;
        check_timeout("compensation_timeout_ms", self.compensation_timeout_ms)?;
        check_concurrency("concurrency_max", self.concurrency_max)?;
        check_retries("retries_max", self.retries_max)?;
        check_timeout("backoff_base_ms", self.backoff_base_ms)?;
        check_timeout("backoff_max_ms", self.backoff_max_ms)?;
        if self.open_sagas_max == 0 || self.open_sagas_max > MAX_OPEN_SAGAS {
            return Err(format!(
                "open_sagas_max is {}, expected 1..={MAX_OPEN_SAGAS}",
                self.open_sagas_max
            ));
        }
        if self.saga_idle_timeout_ms == 0 || self.saga_idle_timeout_ms > MAX_SAGA_IDLE_TIMEOUT_MS {
            return Err(format!(
                "saga_idle_timeout_ms is {}, expected 1..={MAX_SAGA_IDLE_TIMEOUT_MS} ms",
                self.saga_idle_timeout_ms
            ));
        }
        if self.lock_wait_ms > MAX_LOCK_WAIT_MS {
            return Err(format!(
                "lock_wait_ms is {}, expected 0..={MAX_LOCK_WAIT_MS} ms",
                self.lock_wait_ms
            ));
        }
        if self.duplicate_window_ms > MAX_DUPLICATE_WINDOW_MS {
            return Err(format!(
                "duplicate_window is {} ms, expected at most {MAX_DUPLICATE_WINDOW_MS} ms (366d)",
                self.duplicate_window_ms
            ));
        }
        if self.backoff_base_ms > self.backoff_max_ms {
            return Err(format!(
                "backoff_base_ms ({}) is more than backoff_max_ms ({})",
                self.backoff_base_ms, self.backoff_max_ms
            ));
        }
        for (tool, limits) in &self.tools {
            if let Some(value) = limits.timeout_ms {
                check_timeout(&format!("tools.\"{tool}\".timeout_ms"), value)?;
            }
            if let Some(value) = limits.concurrency_max {
                check_concurrency(&format!("tools.\"{tool}\".concurrency_max"), value)?;
            }
            if let Some(value) = limits.retries_max {
                check_retries(&format!("tools.\"{tool}\".retries_max"), value)?;
            }
        }
        Ok(())
    }

    /// How long after its saga ended a step of `tool` may still be undone: the tool's own
    /// window, else [`Limits::undo_window`].
    pub fn undo_window_for(&self, tool: &dyn agent_kernel_api::DynTool) -> UndoWindow {
        tool.undo_window().unwrap_or(self.undo_window)
    }

    /// The timeout for calls of `tool`.
    pub fn timeout_ms_for(&self, tool: &str) -> u64 {
        self.tools
            .get(tool)
            .and_then(|limits| limits.timeout_ms)
            .unwrap_or(self.timeout_ms)
    }

    /// The retry count for calls of `tool`.
    pub fn retries_max_for(&self, tool: &str) -> u32 {
        self.tools
            .get(tool)
            .and_then(|limits| limits.retries_max)
            .unwrap_or(self.retries_max)
    }

    /// The backoff before retry number `retry_idx` (from 0), before jitter.
    pub fn backoff_ms(&self, retry_idx: u32) -> u64 {
        self.backoff_base_ms
            .saturating_mul(1_u64 << retry_idx.min(32))
            .min(self.backoff_max_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_maximum() {
        let limits = Limits {
            backoff_base_ms: 100,
            backoff_max_ms: 1000,
            ..Limits::default()
        };
        let backoffs: Vec<_> = (0..6).map(|idx| limits.backoff_ms(idx)).collect();
        assert_eq!(backoffs, [100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn out_of_range_settings_are_named() {
        assert_eq!(Limits::default().validate(), Ok(()));
        let limits = Limits {
            concurrency_max: 0,
            ..Limits::default()
        };
        assert!(
            limits
                .validate()
                .expect_err("out of range")
                .to_string()
                .contains("concurrency_max")
        );
        let mut limits = Limits::default();
        limits.tools.insert(
            "http.get".into(),
            ToolLimits {
                retries_max: Some(99),
                ..ToolLimits::default()
            },
        );
        assert!(
            limits
                .validate()
                .expect_err("out of range")
                .to_string()
                .contains("http.get")
        );
    }
}

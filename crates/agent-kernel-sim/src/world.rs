//! The simulated world the tools act on, and its journal: every effect, every restore and
//! every outside write, in the order they happened.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Mutex;

/// What happened to the world.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A step's effect: `key` set to `value`.
    Effect {
        /// The saga of the step.
        saga: String,
        /// The step.
        step: u32,
        /// What it changed.
        key: String,
        /// What it wrote.
        value: i64,
    },
    /// A step's compensation put `to` back (`None`: the key removed).
    Restored {
        /// The saga of the step.
        saga: String,
        /// The step.
        step: u32,
        /// What it changed.
        key: String,
        /// What it put back.
        to: Option<i64>,
    },
    /// A compensation that found neither the step's value nor what it restores, and
    /// restored anyway: someone else's write destroyed.
    Clobbered {
        /// The saga of the step.
        saga: String,
        /// The step.
        step: u32,
        /// What it changed.
        key: String,
        /// What it found there.
        found: Option<i64>,
    },
    /// A step was prepared: its undo data read `key` (a note, changing nothing).
    Prepared {
        /// The saga of the step.
        saga: String,
        /// The step.
        step: u32,
        /// What it will change.
        key: String,
    },
    /// A compensation found the key no longer holding its step's value (the effect never
    /// happened, or a later write replaced it) and left it as it was: the upstream
    /// server's `undo`.
    Untouched {
        /// The saga of the step.
        saga: String,
        /// The step.
        step: u32,
        /// What it would have changed.
        key: String,
    },
    /// A step's compensation failed (a simulated fault): nothing restored.
    CompensationFailed {
        /// The saga of the step.
        saga: String,
        /// The step.
        step: u32,
    },
    /// A step's probe failed or hung (a simulated fault): its outcome stays unknown.
    ProbeFailed {
        /// The saga of the step.
        saga: String,
        /// The step.
        step: u32,
    },
    /// A writer outside the kernel (a person, another program) set `key`.
    Outside {
        /// What it changed.
        key: String,
        /// What it wrote.
        value: i64,
    },
    /// An effect or a compensation ([`Event::Effect`], [`Event::Restored`]) whose record
    /// a power loss took, the log at durability `normal` (the checks see it in place of
    /// the event): to the kernel, a change it never made.
    Unlogged(Box<Event>),
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Event::Effect {
                saga,
                step,
                key,
                value,
            } => write!(f, "effect {saga}/{step}: {key} = {value}"),
            Event::Restored {
                saga,
                step,
                key,
                to,
            } => write!(f, "restore {saga}/{step}: {key} = {}", shown(*to)),
            Event::Clobbered {
                saga,
                step,
                key,
                found,
            } => write!(
                f,
                "CLOBBER {saga}/{step}: {key} held {}, restored over it",
                shown(*found)
            ),
            Event::Prepared { saga, step, key } => write!(f, "prepare {saga}/{step}: {key}"),
            Event::Untouched { saga, step, key } => {
                write!(f, "compensation {saga}/{step}: {key} left as it was")
            }
            Event::CompensationFailed { saga, step } => {
                write!(f, "compensation {saga}/{step} failed")
            }
            Event::ProbeFailed { saga, step } => write!(f, "probe {saga}/{step} failed"),
            Event::Outside { key, value } => write!(f, "outside writer: {key} = {value}"),
            Event::Unlogged(was) => write!(f, "{was} (its record lost)"),
        }
    }
}

/// A value as the history shows it.
pub(crate) fn shown(value: Option<i64>) -> String {
    value.map_or_else(|| "(absent)".to_owned(), |value| value.to_string())
}

/// Keys and their values, and the journal of what changed them.
#[derive(Debug, Default)]
pub struct World {
    state: Mutex<WorldState>,
    /// Keys a tool has checked (`changed_since`) and not yet acted on, with the process
    /// whose tool it was: no outside write lands on them meanwhile, as if the tool's check
    /// and act were one compare-and-set. Between the two no kernel can see a writer outside
    /// it.
    checking: Mutex<BTreeSet<(String, String)>>,
    /// What each upstream write (a key and the value written) replaced: the upstream
    /// server's memory, which outlives its processes, as a service's does.
    replaced: Mutex<BTreeMap<(String, i64), Option<i64>>>,
}

/// A copy of the world at one moment.
#[derive(Debug, Default, Clone)]
pub struct WorldState {
    /// Each key's value.
    pub values: BTreeMap<String, i64>,
    /// Everything that changed them, oldest first.
    pub journal: Vec<Event>,
}

impl World {
    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<i64> {
        self.lock().values.get(key).copied()
    }

    /// Sets `key` and notes why.
    pub(crate) fn set(&self, key: &str, value: Option<i64>, event: Event) {
        let mut state = self.lock();
        match value {
            Some(value) => state.values.insert(key.to_owned(), value),
            None => state.values.remove(key),
        };
        state.journal.push(event);
    }

    /// Notes an event that changes nothing by itself.
    pub(crate) fn note(&self, event: Event) {
        self.lock().journal.push(event);
    }

    /// A tool of process `by` checked `key` and is about to act on it.
    pub(crate) fn checked(&self, key: &str, by: &str) {
        self.checks().insert((key.to_owned(), by.to_owned()));
    }

    /// A tool of process `by` acted on `key` (or will not).
    pub(crate) fn acted(&self, key: &str, by: &str) {
        self.checks().remove(&(key.to_owned(), by.to_owned()));
    }

    /// Process `by` acts on none of the keys it checked: it ended a command whose checks no
    /// act followed (an `undo` whose preview looked at every step, then was refused).
    pub(crate) fn forget_checks_of(&self, by: &str) {
        self.checks().retain(|(_, process)| process != by);
    }

    /// Whether an outside write on `key` must wait: a tool is between its check and its act.
    pub(crate) fn is_checking(&self, key: &str) -> bool {
        self.checks().iter().any(|(checked, _)| checked == key)
    }

    fn checks(&self) -> std::sync::MutexGuard<'_, BTreeSet<(String, String)>> {
        self.checking
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes what writing `value` to `key` replaces (its value now), for the upstream
    /// server's `undo`.
    pub(crate) fn remember_replaced(&self, key: &str, value: i64) {
        let now = self.get(key);
        self.replaced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert((key.to_owned(), value), now);
    }

    /// What the upstream write of `value` to `key` replaced.
    pub(crate) fn replaced(&self, key: &str, value: i64) -> Option<i64> {
        self.replaced
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&(key.to_owned(), value))
            .copied()
            .flatten()
    }

    /// How many events the journal holds.
    pub(crate) fn journal_len(&self) -> usize {
        self.lock().journal.len()
    }

    /// A copy of the world now.
    pub fn snapshot(&self) -> WorldState {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, WorldState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

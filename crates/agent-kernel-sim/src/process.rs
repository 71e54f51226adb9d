//! One simulated process: where it is (every log write and every tool effect or
//! compensation is a numbered point), the fault planned at one point, and whether it died.

use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::scenario::{Outside, Rng};
use crate::world::{Event, World};

/// What goes wrong at a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// The process is killed just before the point: the write or the effect never happens.
    CrashBefore,
    /// The process is killed just after the point: the write is committed (the effect
    /// happened), and nobody hears of it.
    CrashAfter,
    /// A log write fails with an I/O error and writes nothing; a tool's effect happens and
    /// its answer is an error of unknown outcome; a compensation fails. The process goes on.
    Error,
    /// At a tool's point only: the effect or compensation never answers, having done
    /// nothing; the engine's timeout gives up on it. The process goes on.
    HangBefore,
    /// At a tool's point only: the effect or compensation is done, then never answers; the
    /// engine's timeout gives up on it. The process goes on.
    HangAfter,
    /// The machine loses power just after the point, its log at durability `full`: every
    /// process of the machine dies at once; what was committed survives, and, with
    /// `head_behind`, the audit head file is the one before the last write moved it, if the
    /// last write did (its sync follows the answer).
    PowerLossFull {
        /// Whether the head file's last move is lost.
        head_behind: bool,
    },
    /// The machine loses power just after the point, its log at durability `normal`: every
    /// process of the machine dies at once, and of the commits since the last sync only a
    /// prefix survives: all but the last `writes_lost` log writes (all, when fewer were
    /// made); the audit head file, never synced, is as it was `head_back` writes before the
    /// last.
    PowerLossNormal {
        /// How many of the newest log writes are lost.
        writes_lost: u16,
        /// How many writes back the head file is kept as it was.
        head_back: u16,
    },
}

impl FaultKind {
    /// Every kind, in the order the explorer tries them.
    pub const ALL: [FaultKind; 5] = [
        FaultKind::CrashBefore,
        FaultKind::CrashAfter,
        FaultKind::Error,
        FaultKind::HangBefore,
        FaultKind::HangAfter,
    ];

    /// The kinds that apply at every point, a log write's too.
    pub const ANYWHERE: [FaultKind; 3] = [
        FaultKind::CrashBefore,
        FaultKind::CrashAfter,
        FaultKind::Error,
    ];

    /// Whether it applies at a log write (a hang applies only at a tool's point: the log
    /// has no timeout, so a log write that never answers is a kill).
    pub fn applies_at_log_write(self) -> bool {
        !matches!(self, FaultKind::HangBefore | FaultKind::HangAfter)
    }

    /// Whether the machine loses power: every process of it dies, and what was not synced
    /// may be lost.
    pub fn is_power_loss(self) -> bool {
        matches!(
            self,
            FaultKind::PowerLossFull { .. } | FaultKind::PowerLossNormal { .. }
        )
    }
}

/// One fault: at the point numbered `at` (from 0) of one process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// The point.
    pub at: u64,
    /// What goes wrong there.
    pub kind: FaultKind,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            FaultKind::CrashBefore => "killed before".to_owned(),
            FaultKind::CrashAfter => "killed after".to_owned(),
            FaultKind::Error => "an error at".to_owned(),
            FaultKind::HangBefore => "a hang, nothing done, at".to_owned(),
            FaultKind::HangAfter => "a hang, done, at".to_owned(),
            FaultKind::PowerLossFull { head_behind } => format!(
                "the power lost (durability full{}) after",
                if head_behind {
                    ", the head file's last move lost"
                } else {
                    ""
                }
            ),
            FaultKind::PowerLossNormal {
                writes_lost,
                head_back,
            } => format!(
                "the power lost (durability normal, the last {writes_lost} log writes lost, the head file as {head_back} writes back) after"
            ),
        };
        write!(f, "{kind} point {}", self.at)
    }
}

/// What the caller of [`Process::point`] does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    /// Go on.
    Go,
    /// Stop forever without acting: the process died.
    CrashBefore,
    /// Act, then stop forever.
    CrashAfter,
    /// Fail as [`FaultKind::Error`] says.
    Fail,
    /// Never answer, having done nothing ([`FaultKind::HangBefore`]).
    HangBefore,
    /// Act, then never answer ([`FaultKind::HangAfter`]).
    HangAfter,
}

impl State {
    /// Whether its fault fired, and was a power loss.
    fn lost_power(&self) -> bool {
        self.fired && self.fault.is_some_and(|fault| fault.kind.is_power_loss())
    }
}

/// A simulated process: its points, its fault, its death.
pub(crate) struct Process {
    name: String,
    state: Mutex<State>,
    died: Notify,
    world: Arc<World>,
    /// The other processes of the machine, which a power loss at this one's point kills too.
    machine: Mutex<Vec<Arc<Process>>>,
}

struct State {
    next_point: u64,
    /// Whether each point reached was a log write.
    log_writes: Vec<bool>,
    fault: Option<Fault>,
    fired: bool,
    dead: bool,
    schedule: Rng,
    outside: Vec<Outside>,
    history: Vec<String>,
}

impl Process {
    /// Process `name`, planned to meet `fault`, whose interleavings `schedule` decides;
    /// writers outside the kernel act at the points `outside` names.
    pub(crate) fn new(
        name: &str,
        fault: Option<Fault>,
        schedule: Rng,
        outside: Vec<Outside>,
        world: Arc<World>,
    ) -> Process {
        Process {
            name: name.to_owned(),
            state: Mutex::new(State {
                next_point: 0,
                log_writes: Vec::new(),
                fault,
                fired: false,
                dead: false,
                schedule,
                outside,
                history: Vec::new(),
            }),
            died: Notify::new(),
            world,
            machine: Mutex::new(Vec::new()),
        }
    }

    /// `other` runs on this process's machine: a power loss at one of this process's points
    /// kills it too, at the same instant.
    pub(crate) fn shares_machine_with(&self, other: Arc<Process>) {
        self.machine
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(other);
    }

    /// Reaches the next point, described by `what`. At a log write (`log_write`), the
    /// outside writes due by then happen first, except on a key a tool has checked and not
    /// yet acted on ([`World::checked`]).
    pub(crate) fn point(&self, what: &str, log_write: bool) -> Act {
        let mut state = self.lock();
        let at = state.next_point;
        state.next_point += 1;
        state.log_writes.push(log_write);
        let due: Vec<Outside> = if log_write {
            let world = &self.world;
            let (due, later) = state
                .outside
                .drain(..)
                .partition(|write| write.at <= at && !world.is_checking(&write.key));
            state.outside = later;
            due
        } else {
            Vec::new()
        };
        for write in due {
            let event = Event::Outside {
                key: write.key.clone(),
                value: write.value,
            };
            state.history.push(format!("{} #{at}: {event}", self.name));
            self.world.set(&write.key, Some(write.value), event);
        }
        let act = match state.fault {
            Some(fault) if fault.at == at => {
                state.fired = true;
                match fault.kind {
                    FaultKind::CrashBefore => Act::CrashBefore,
                    FaultKind::CrashAfter => Act::CrashAfter,
                    FaultKind::PowerLossFull { .. } | FaultKind::PowerLossNormal { .. } => {
                        Act::CrashAfter
                    }
                    FaultKind::Error => Act::Fail,
                    // Never planned at a log write; were it, the write goes on.
                    _ if log_write => Act::Go,
                    FaultKind::HangBefore => Act::HangBefore,
                    FaultKind::HangAfter => Act::HangAfter,
                }
            }
            _ => Act::Go,
        };
        let note = match act {
            Act::Go => String::new(),
            Act::CrashBefore => " <- killed before it".to_owned(),
            Act::CrashAfter if state.lost_power() => " <- the power lost after it".to_owned(),
            Act::CrashAfter => " <- killed after it".to_owned(),
            Act::Fail => " <- fails".to_owned(),
            Act::HangBefore => " <- hangs before it".to_owned(),
            Act::HangAfter => " <- hangs after it".to_owned(),
        };
        state
            .history
            .push(format!("{} #{at}: {what}{note}", self.name));
        act
    }

    /// Adds a line to the history.
    pub(crate) fn note(&self, line: String) {
        self.lock().history.push(format!("{}: {line}", self.name));
    }

    /// The process's name, as its history shows it.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Ends the checks of keys this process made that no act of it followed
    /// ([`World::forget_checks_of`]).
    pub(crate) fn forget_checks(&self) {
        self.world.forget_checks_of(&self.name);
    }

    /// The process is killed: nothing of it acts from now on (so none of its checks is
    /// followed by an act).
    pub(crate) fn die(&self) {
        self.forget_checks();
        let power_lost = {
            let mut state = self.lock();
            state.dead = true;
            state.lost_power()
        };
        self.died.notify_one();
        if power_lost {
            let machine = std::mem::take(
                &mut *self
                    .machine
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            );
            for other in machine {
                if !other.is_dead() {
                    other.note("the power lost".to_owned());
                    other.die();
                }
            }
        }
    }

    /// Whether its fault was a power loss, and fired.
    pub(crate) fn lost_power(&self) -> bool {
        self.lock().lost_power()
    }

    /// Whether it was killed.
    pub(crate) fn is_dead(&self) -> bool {
        self.lock().dead
    }

    /// Resolves once the process is killed.
    pub(crate) async fn killed(&self) {
        self.died.notified().await;
    }

    /// Before each point: stays pending forever once the process is dead, and lets other
    /// tasks run first as many times as the schedule says (0 to 2).
    pub(crate) async fn gate(&self) {
        let yields = {
            let mut state = self.lock();
            if state.dead {
                None
            } else {
                Some(state.schedule.below(3))
            }
        };
        let Some(yields) = yields else {
            return std::future::pending().await;
        };
        for _ in 0..yields {
            tokio::task::yield_now().await;
        }
        if self.is_dead() {
            std::future::pending::<()>().await;
        }
    }

    /// How many points it reached, and whether its fault fired.
    pub(crate) fn points(&self) -> (u64, bool) {
        let state = self.lock();
        (state.next_point, state.fired)
    }

    /// Whether each point it reached was a log write, in order.
    pub(crate) fn log_writes(&self) -> Vec<bool> {
        self.lock().log_writes.clone()
    }

    /// What it did, one line per point.
    pub(crate) fn history(&self) -> Vec<String> {
        self.lock().history.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

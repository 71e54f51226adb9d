//! The kill switch: an observer of the SQLite log's writes (transactions) that SIGKILLs its
//! own process at a chosen one, before it is applied or just after it is durable, put around
//! the log with `KernelBuilder::wrap_log` and `ObservedLog`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use agent_kernel_api::WriteObserver;

use crate::scenario::KillPoint;

/// Kills the process at `point` (never, when `None`) and counts the writes begun.
pub(crate) struct KillSwitch {
    point: Option<KillPoint>,
    writes: Arc<AtomicU32>,
}

impl KillSwitch {
    /// A switch for `point`, counting into `writes`.
    pub(crate) fn new(point: Option<KillPoint>, writes: Arc<AtomicU32>) -> KillSwitch {
        KillSwitch { point, writes }
    }

    fn at(&self, point: KillPoint) -> bool {
        self.point == Some(point)
    }
}

/// SIGKILL to this process: no destructor, no flush, no exit handler runs. The kill is
/// first counted in the file `AGENT_KERNEL_KILL_TALLY` names, when set (CI's total of real
/// kills, beside the binary's tests).
pub(crate) fn die() -> ! {
    if let Some(path) = std::env::var_os("AGENT_KERNEL_KILL_TALLY") {
        use std::io::Write as _;
        if let Ok(mut tally) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = tally.write_all(b"sigkill\n");
        }
    }
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    unreachable!("SIGKILL is not caught");
}

impl WriteObserver for KillSwitch {
    fn before_write(&self, n: u64) {
        let n = u32::try_from(n).expect("a scenario writes a few times");
        self.writes.store(n + 1, Ordering::SeqCst);
        if self.at(KillPoint::BeforeWrite(n)) {
            die();
        }
    }

    fn after_write(&self, n: u64, applied: bool) {
        let n = u32::try_from(n).expect("a scenario writes a few times");
        if applied && self.at(KillPoint::AfterWrite(n)) {
            die();
        }
    }
}

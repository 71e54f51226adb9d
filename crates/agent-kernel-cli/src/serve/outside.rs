//! The console's thread outside the second line: started before the process confines itself
//! to the sandbox's roots, it keeps its access to the log's folder, so the audit check and
//! the operator lock beside the log (which read and open files there) still work from a
//! console that has long been confined.

use std::future::Future;
use std::pin::Pin;

use agent_kernel::KernelError;
use agent_kernel_api::TxError;
use tokio::sync::{mpsc, oneshot};

/// A piece of work for the outside thread.
type Job = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The handle of the outside thread: each [`Outside::run`] runs there, concurrently with
/// the others, on a runtime of that thread's own (whose threads are started from it, so
/// unconfined too).
#[derive(Debug)]
pub(crate) struct Outside {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Outside {
    /// Starts the thread. Call it before the process confines itself.
    ///
    /// # Errors
    ///
    /// When the thread or its runtime cannot be started.
    pub(crate) fn start() -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        std::thread::Builder::new()
            .name("agent-kernel-console-outside".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    while let Some(job) = queue.recv().await {
                        tokio::spawn(job);
                    }
                });
            })?;
        Ok(Self { jobs })
    }

    /// Runs `work` on the outside thread and waits for its answer.
    ///
    /// # Errors
    ///
    /// [`KernelError::Log`] when the thread has stopped.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, KernelError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || {
            KernelError::Log(TxError::Storage(
                "the console's thread outside the sandbox has stopped".to_owned(),
            ))
        };
        self.jobs
            .send(Box::pin(async move {
                let _ = reply.send(work.await);
            }))
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())
    }
}

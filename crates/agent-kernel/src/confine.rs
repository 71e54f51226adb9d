//! The second line, as an explicit call: after a kernel is open, [`Opened::confine`]
//! confines this process to the policy's roots and network rules (Landlock), and starts
//! the launcher from which command tools' programs run, each to its own access.

use std::path::PathBuf;
use std::sync::Arc;

use agent_kernel_core::{Kernel, KernelError};
use agent_kernel_sandbox::{NetworkLine, Policy, SecondLine, restrict_network, restrict_to_roots};

/// A kernel just opened by [`KernelBuilder::open`](crate::KernelBuilder::open), with what
/// confining this process afterwards needs.
#[derive(Debug)]
pub struct Opened {
    /// The kernel.
    pub kernel: Arc<Kernel>,
    policy: Policy,
    protected: Vec<PathBuf>,
}

/// What [`Opened::confine`] achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confinement {
    /// The file rules: enforced (fully, or a subset on an older kernel), or unavailable.
    pub files: SecondLine,
    /// The network rules.
    pub network: NetworkLine,
}

impl Opened {
    pub(crate) fn new(kernel: Arc<Kernel>, policy: Policy, protected: Vec<PathBuf>) -> Self {
        Self {
            kernel,
            policy,
            protected,
        }
    }

    /// The policy the kernel's tools run under.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The files no program a command tool starts may open: the log's, the operator key
    /// file, and those given to [`KernelBuilder::protect_file`](crate::KernelBuilder::protect_file).
    pub fn protected_files(&self) -> &[PathBuf] {
        &self.protected
    }

    /// Confines this thread, and every thread and process it starts from now on, to the
    /// policy's allowed roots, the system folders and its network rules, after starting the
    /// thread that launches command tools' programs (each confined to what its tool
    /// declares, never to [`protected_files`](Self::protected_files)). Threads started
    /// before (the log's writer, an exporter) keep their access. Permanent; call it once,
    /// after everything the process needs outside the roots is open, and from the thread
    /// that goes on to run sagas (the runtime's threads are started after it).
    ///
    /// A kernel whose process is not confined still confines every file tool by its
    /// capability handles (the first line); this adds the operating system's.
    ///
    /// # Errors
    ///
    /// [`KernelError::Setup`] when the launcher thread cannot be started.
    pub fn confine(&self) -> Result<Confinement, KernelError> {
        agent_kernel_sandbox::start_launcher(&self.policy, self.protected.clone()).map_err(
            |error| {
                KernelError::Setup(format!(
                    "cannot start the thread that launches programs: {error}"
                ))
            },
        )?;
        let files = restrict_to_roots(&self.policy);
        match &files {
            SecondLine::Enforced { fully } => {
                tracing::debug!(fully, "landlock confines tools to the allowed roots");
            }
            SecondLine::Unavailable { reason } => {
                tracing::warn!(%reason, "no OS second line; the capability handles alone confine file tools");
            }
            _ => {}
        }
        let network = restrict_network(&self.policy);
        match &network {
            NetworkLine::Unavailable { reason } => {
                tracing::info!(%reason, "no OS second line for the network; the first line alone rules on URLs");
            }
            line => tracing::debug!(?line, "landlock confines TCP"),
        }
        Ok(Confinement { files, network })
    }
}

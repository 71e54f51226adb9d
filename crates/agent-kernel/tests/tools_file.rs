//! The tools file is read once for its command tools and its upstream servers.

use std::sync::mpsc;
use std::time::Duration;

use agent_kernel::{Limits, Policy};

/// How long the load may take before the test calls it stuck (only a failure waits this
/// long).
const LOAD_WAIT: Duration = Duration::from_secs(20);

/// A FIFO can be read once: a second open waits for a writer that never comes. Loading
/// from one therefore shows that both loaders work from the same text, so an edit between
/// two reads can never give the command tools of one version and the servers of another.
#[test]
fn the_tools_file_is_read_once_for_its_command_tools_and_its_servers() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fifo = dir.path().join("tools.toml");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("runs mkfifo");
    assert!(made.success(), "mkfifo: {made}");
    let writer = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            // Opening for writing waits for the reader, once.
            std::fs::write(
                &fifo,
                "[tools.\"note.read\"]\neffect = \"read-only\"\nsettlement = \"compensate\"\nexecute = [\"cat\"]\n",
            )
            .expect("writes the FIFO");
        })
    };
    let policy = Policy::from_toml_str("", dir.path()).expect("a policy");
    let (done, loaded) = mpsc::channel();
    std::thread::spawn(move || {
        let mut limits = Limits::default();
        let _ = done.send(
            agent_kernel::declared_tools(&fifo, &policy, &mut limits, None).map(|tools| {
                tools
                    .required
                    .iter()
                    .map(|tool| tool.id().to_owned())
                    .collect::<Vec<_>>()
            }),
        );
    });
    let ids = loaded
        .recv_timeout(LOAD_WAIT)
        .expect("the load ended: the tools file was not opened a second time")
        .expect("loads");
    assert_eq!(ids, ["note.read"]);
    writer.join().expect("the writer ends");
}

//! The server's standard input and output, read and written by the runtime's own thread
//! when they are anonymous pipes, as an MCP client starting the server makes them.
//!
//! Tokio's `stdin()` and `stdout()` read and write on its blocking pool: each request then
//! wakes a pool thread, which wakes the runtime, and each answer wakes a pool thread again,
//! two thread hand-offs a call that cost tens of microseconds each on a busy machine. A pipe
//! opened again through `/proc/self/fd` is a description of its own, made non-blocking
//! without changing the one the server inherited (which other processes may share), and
//! polled by the runtime like a socket. Anything else (a named FIFO, a terminal, a file, a
//! socket, a pipe that cannot be opened again, no `/proc`) is read and written as before.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

/// Standard input, as the runtime's pipe when it is an anonymous pipe.
pub(crate) fn input() -> Pin<Box<dyn AsyncRead + Send>> {
    match reopened(0, false).and_then(|file| pipe::Receiver::from_file(file).ok()) {
        Some(pipe) => Box::pin(pipe),
        None => Box::pin(tokio::io::stdin()),
    }
}

/// Standard output, as the runtime's pipe when it is an anonymous pipe.
pub(crate) fn output() -> Pin<Box<dyn AsyncWrite + Send>> {
    match reopened(1, true).and_then(|file| pipe::Sender::from_file(file).ok()) {
        Some(pipe) => Box::pin(pipe),
        None => Box::pin(tokio::io::stdout()),
    }
}

/// The anonymous pipe open as `fd`, opened again non-blocking for reading or `write`;
/// `None` when `fd` is anything else or cannot be opened again. A named FIFO is left alone:
/// opened again non-blocking while no writer holds it, Linux hides its hang-up from the new
/// description until a writer opens it, so the end of input would never be seen.
fn reopened(fd: i32, write: bool) -> Option<File> {
    let path = format!("/proc/self/fd/{fd}");
    if !std::fs::read_link(&path)
        .ok()?
        .to_string_lossy()
        .starts_with("pipe:")
    {
        return None;
    }
    OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::io::Write;
    use std::os::fd::AsRawFd;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The `flags` of this process's descriptor `fd`, from `/proc` (octal there).
    fn flags(fd: i32) -> i32 {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).expect("fdinfo");
        let flags = info
            .lines()
            .find_map(|line| line.strip_prefix("flags:"))
            .expect("a flags line");
        i32::from_str_radix(flags.trim(), 8).expect("octal flags")
    }

    /// A pipe opened again is read and written by the runtime, and the descriptions the
    /// process holds stay blocking.
    #[tokio::test]
    async fn a_pipe_is_opened_again_without_changing_the_inherited_description() {
        let (reader, mut writer) = std::io::pipe().expect("a pipe");
        let own = reopened(reader.as_raw_fd(), false).expect("a pipe is opened again");
        let mut receiver = pipe::Receiver::from_file(own).expect("a pipe to poll");
        writer.write_all(b"hello\n").expect("writes");
        let mut line = [0u8; 6];
        receiver.read_exact(&mut line).await.expect("reads");
        assert_eq!(&line, b"hello\n");
        assert_eq!(flags(reader.as_raw_fd()) & libc::O_NONBLOCK, 0);

        let (mut reader, writer) = std::io::pipe().expect("a pipe");
        let own = reopened(writer.as_raw_fd(), true).expect("a pipe is opened again");
        let mut sender = pipe::Sender::from_file(own).expect("a pipe to poll");
        sender.write_all(b"answer\n").await.expect("writes");
        let mut answer = [0u8; 7];
        std::io::Read::read_exact(&mut reader, &mut answer).expect("reads");
        assert_eq!(&answer, b"answer\n");
        assert_eq!(flags(writer.as_raw_fd()) & libc::O_NONBLOCK, 0);
    }

    /// What is not an anonymous pipe is left to Tokio's standard streams: a file, and a
    /// named FIFO (whose end of input a description opened again might never see).
    #[test]
    fn a_file_and_a_named_fifo_are_not_opened_again() {
        let path = std::env::temp_dir().join(format!("ak-stdio-{}", std::process::id()));
        let file = File::create(&path).expect("creates");
        std::fs::remove_file(&path).expect("removes");
        assert!(reopened(file.as_raw_fd(), false).is_none());

        let fifo = std::env::temp_dir().join(format!("ak-stdio-fifo-{}", std::process::id()));
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("runs mkfifo");
        assert!(made.success());
        let reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .expect("opens the FIFO");
        std::fs::remove_file(&fifo).expect("removes");
        assert!(reopened(reader.as_raw_fd(), false).is_none());
    }
}

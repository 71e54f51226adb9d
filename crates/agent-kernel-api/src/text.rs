//! Reading the operator's small text files (`tools.toml` and the like) with a bound, and
//! naming lines in their errors.

use std::io::{self, Read};

/// The 1-based line of byte `offset` in `text`.
pub fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The text `reader` gives, read to at most one byte past `max_bytes` (a file the
/// operator wrote, opened by the caller: `api` touches no file system).
///
/// # Errors
///
/// An [`io::Error`] whose message is a sentence about the text, for the caller to put
/// after the file's name: `cannot read it: …` (which covers text that is not UTF-8, kind
/// [`io::ErrorKind::InvalidData`]), or `it is more than N bytes` (kind
/// [`io::ErrorKind::FileTooLarge`]).
pub fn read_text_bounded(reader: impl Read, max_bytes: usize) -> io::Result<String> {
    let mut text = String::new();
    reader
        .take(
            u64::try_from(max_bytes)
                .unwrap_or(u64::MAX)
                .saturating_add(1),
        )
        .read_to_string(&mut text)
        .map_err(|io| io::Error::new(io.kind(), format!("cannot read it: {io}")))?;
    if text.len() > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("it is more than {max_bytes} bytes"),
        ));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_count_from_one_and_offsets_past_the_end_stay_on_the_last() {
        assert_eq!(line_of("a\nb\nc", 0), 1);
        assert_eq!(line_of("a\nb\nc", 2), 2);
        assert_eq!(line_of("a\nb\nc", 99), 3);
    }

    #[test]
    fn a_text_over_the_bound_is_refused() {
        assert_eq!(read_text_bounded(&b"12345"[..], 5).expect("fits"), "12345");
        let error = read_text_bounded(&b"12345"[..], 4).expect_err("too large");
        assert_eq!(error.to_string(), "it is more than 4 bytes");
        assert_eq!(error.kind(), io::ErrorKind::FileTooLarge);
        assert!(read_text_bounded(&b"\xff"[..], 4).is_err(), "not UTF-8");
    }
}

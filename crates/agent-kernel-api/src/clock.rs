//! Injected time and identity.

use crate::SagaId;

/// The source of wall-clock time for everything the kernel records.
///
/// Injected so that tests and replays are deterministic.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The source of saga ids.
///
/// Ids must be unique across processes sharing one log; implementations based on
/// time-ordered UUIDs (v7) also make ids sort by creation time.
pub trait IdSource: Send + Sync + 'static {
    /// A new, never before returned saga id.
    fn new_saga_id(&self) -> SagaId;

    /// A new, never before returned id for another record (an approval request, a dead
    /// letter). By default drawn from the saga ids, which are unique already.
    fn new_record_id(&self) -> String {
        self.new_saga_id().as_str().to_owned()
    }
}

/// A time in ms since the Unix epoch as RFC 3339 in UTC with milliseconds
/// (`2026-12-01T14:38:05.123Z`): how documents and listings print times.
pub fn format_rfc3339_ms(at_ms: i64) -> String {
    let secs = at_ms.div_euclid(1000);
    let millis = at_ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A UTC time as people type it, in ms since the Unix epoch: `2026-12-01`,
/// `2026-12-01T14:38`, `2026-12-01T14:38:05` or with milliseconds, each optionally ending
/// in `Z` (a space may stand for the `T`); what [`format_rfc3339_ms`] prints reads back.
/// `None` for anything else (another zone, a month 13, a 31 February).
pub fn parse_utc_ms(text: &str) -> Option<i64> {
    let text = text.trim();
    let text = text.strip_suffix(['Z', 'z']).unwrap_or(text);
    let (date, time) = match text.split_once(['T', 't', ' ']) {
        Some((date, time)) => (date, Some(time)),
        None => (text, None),
    };
    let number = |part: &str, digits: usize| -> Option<i64> {
        (part.len() == digits && part.bytes().all(|b| b.is_ascii_digit()))
            .then(|| part.parse().ok())
            .flatten()
    };
    let mut fields = date.split('-');
    let year = number(fields.next()?, 4)?;
    let month = number(fields.next()?, 2)?;
    let day = number(fields.next()?, 2)?;
    if fields.next().is_some() || !(1..=12).contains(&month) {
        return None;
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let month_days = match month {
        2 if leap => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    };
    if !(1..=month_days).contains(&day) {
        return None;
    }
    let (mut hour, mut minute, mut second, mut millis) = (0, 0, 0, 0);
    if let Some(time) = time {
        let (clock, fraction) = match time.split_once('.') {
            Some((clock, fraction)) => (clock, Some(fraction)),
            None => (time, None),
        };
        let mut parts = clock.split(':');
        hour = number(parts.next()?, 2)?;
        minute = number(parts.next()?, 2)?;
        if let Some(part) = parts.next() {
            second = number(part, 2)?;
        }
        if parts.next().is_some() || hour > 23 || minute > 59 || second > 59 {
            return None;
        }
        if let Some(fraction) = fraction {
            millis = number(fraction, 3)?;
        }
    }
    // Days since 1970-01-01 from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + hour) * 60 + minute) * 60_000 + second * 1000 + millis)
}

#[cfg(test)]
mod tests {
    use super::{format_rfc3339_ms, parse_utc_ms};

    #[test]
    fn typed_times_read_as_utc() {
        assert_eq!(parse_utc_ms("1970-01-01"), Some(0));
        assert_eq!(
            parse_utc_ms("2000-02-29T00:00:00.123Z"),
            Some(951_782_400_123)
        );
        assert_eq!(parse_utc_ms("2026-12-01 14:38"), Some(1_796_135_880_000));
        assert_eq!(parse_utc_ms("1969-12-31T23:59:59.999Z"), Some(-1));
        for bad in [
            "",
            "2026-13-01",
            "2025-02-29",
            "2026-12-01T24:00",
            "2026-12-01T14",
            "2026-12-01T14:38+01:00",
            "26-12-01",
            "2026-12-01T14:38:05.5",
        ] {
            assert_eq!(parse_utc_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn every_printed_time_reads_back() {
        // Every 997th second over 400 years and then some, with odd milliseconds.
        let mut at_ms = -2_208_988_800_000_i64; // 1900-01-01
        while at_ms < 12_000_000_000_000 {
            assert_eq!(
                parse_utc_ms(&format_rfc3339_ms(at_ms)),
                Some(at_ms),
                "{at_ms}"
            );
            at_ms += 997_000 * 1_009 + 7;
        }
    }

    #[test]
    fn times_print_as_rfc3339_in_utc() {
        assert_eq!(format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_rfc3339_ms(951_782_400_123),
            "2000-02-29T00:00:00.123Z"
        );
        assert_eq!(
            format_rfc3339_ms(1_796_135_885_007),
            "2026-12-01T14:38:05.007Z"
        );
        assert_eq!(format_rfc3339_ms(-1), "1969-12-31T23:59:59.999Z");
    }
}

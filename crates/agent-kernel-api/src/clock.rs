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

#[cfg(test)]
mod tests {
    use super::format_rfc3339_ms;

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

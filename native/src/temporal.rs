//! Dates and times, as `core/pgtypes/temporal.py` converts them (DateStyle=ISO,
//! IntervalStyle=postgres): the proleptic Gregorian calendar for BC dates and years past 9999, the
//! infinity sentinels at the ends of Avro's int and long, `24:00:00`, any UTC offset.
//!
//! The reference tries `datetime.fromisoformat` first and falls back to a regular expression and
//! plain arithmetic; for every text both accept, both give the same number, so this module does the
//! arithmetic on the expression's grammar and declines the rest (the reference raises for it, or
//! takes a path whose result it alone defines, such as a naive text in a timestamptz column).

use crate::Decline;

pub const DATE_POS_INFINITY: i64 = i32::MAX as i64;
pub const DATE_NEG_INFINITY: i64 = i32::MIN as i64;
pub const TIMESTAMP_POS_INFINITY: i64 = i64::MAX;
pub const TIMESTAMP_NEG_INFINITY: i64 = i64::MIN;
const MICROS_PER_SECOND: i128 = 1_000_000;
const SECONDS_PER_DAY: i128 = 86_400;
const MICROS_PER_DAY: i128 = SECONDS_PER_DAY * MICROS_PER_SECOND;
const MAX_YEAR_DIGITS: usize = 9;
const DECLINED: Decline = Decline("date/time text outside the canonical ISO grammar");

/// Days since 1970-01-01 of a proleptic Gregorian date (astronomical years), Hinnant's algorithm
/// with Python's floor division, for any month and day numbers the grammar lets through.
pub fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = year - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2).div_euclid(5) + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = shifted_month + if shifted_month < 10 { 3 } else { -9 };
    (year_of_era + era * 400 + i64::from(month <= 2), month, day)
}

/// `pgtemporal.iso_year`: four digits, `-` before astronomical years below 1, `+` after 9999.
fn write_iso_year(year: i64, out: &mut Vec<u8>) {
    use std::io::Write;
    if year < 0 {
        let _ = write!(out, "-{:04}", -year);
    } else if year <= 9999 {
        let _ = write!(out, "{:04}", year);
    } else {
        let _ = write!(out, "+{}", year);
    }
}

struct Cursor<'t> {
    text: &'t [u8],
    pos: usize,
}

impl<'t> Cursor<'t> {
    fn new(text: &'t [u8]) -> Self {
        Cursor { text, pos: 0 }
    }
    fn done(&self) -> bool {
        self.pos == self.text.len()
    }
    fn eat(&mut self, byte: u8) -> bool {
        if self.text.get(self.pos) == Some(&byte) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn eat_str(&mut self, literal: &[u8]) -> bool {
        if self.text[self.pos..].starts_with(literal) {
            self.pos += literal.len();
            true
        } else {
            false
        }
    }
    /// Between `min` and `max` ASCII digits (greedy), as their value; None when fewer than `min`.
    fn digits(&mut self, min: usize, max: usize) -> Option<(i64, usize)> {
        let start = self.pos;
        let mut value: i64 = 0;
        while self.pos < self.text.len() && self.pos - start < max && self.text[self.pos].is_ascii_digit() {
            value = value * 10 + i64::from(self.text[self.pos] - b'0');
            self.pos += 1;
        }
        let count = self.pos - start;
        if count < min {
            self.pos = start;
            None
        } else {
            Some((value, count))
        }
    }
    /// Exactly `count` digits.
    fn fixed(&mut self, count: usize) -> Option<i64> {
        let start = self.pos;
        let (value, got) = self.digits(count, count)?;
        if got != count {
            self.pos = start;
            return None;
        }
        Some(value)
    }
    /// `\d{4,}` with at most MAX_YEAR_DIGITS (more is declined: the reference's ints are unbounded).
    fn year(&mut self) -> Result<i64, Decline> {
        let start = self.pos;
        while self.pos < self.text.len() && self.text[self.pos].is_ascii_digit() {
            self.pos += 1;
        }
        let count = self.pos - start;
        if !(4..=MAX_YEAR_DIGITS).contains(&count) {
            return Err(DECLINED);
        }
        Ok(self.text[start..self.pos]
            .iter()
            .fold(0i64, |v, d| v * 10 + i64::from(d - b'0')))
    }
    /// `\.(\d{1,6})` -> microseconds (right-padded), 0 when absent.
    fn fraction(&mut self) -> Result<i64, Decline> {
        if !self.eat(b'.') {
            return Ok(0);
        }
        let (value, count) = self.digits(1, 6).ok_or(DECLINED)?;
        Ok(value * 10i64.pow(6 - count as u32))
    }
}

fn require_ascii(text: &[u8]) -> Result<(), Decline> {
    if text.is_ascii() {
        Ok(())
    } else {
        Err(DECLINED)
    }
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        4 | 6 | 9 | 11 => 30,
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        _ => 31,
    }
}

/// `(\d{4,})-(\d\d)-(\d\d)( BC)?` -> (astronomical year, month, day), then the position after it.
fn date_parts(cursor: &mut Cursor<'_>) -> Result<(i64, i64, i64, bool), Decline> {
    let year = cursor.year()?;
    if !cursor.eat(b'-') {
        return Err(DECLINED);
    }
    let month = cursor.fixed(2).ok_or(DECLINED)?;
    if !cursor.eat(b'-') {
        return Err(DECLINED);
    }
    let day = cursor.fixed(2).ok_or(DECLINED)?;
    Ok((year, month, day, false))
}

/// date text -> days since 1970-01-01 (`pgtemporal.date_days`).
pub fn date_days(text: &[u8]) -> Result<i64, Decline> {
    require_ascii(text)?;
    if text.len() == 10 {
        // The reference's `date.fromisoformat`: a real date of years 1-9999 only.
        let mut cursor = Cursor::new(text);
        let (year, month, day, _) = date_parts(&mut cursor)?;
        if !cursor.done()
            || year < 1
            || !(1..=12).contains(&month)
            || day < 1
            || day > days_in_month(year, month)
        {
            return Err(DECLINED);
        }
        return Ok(days_from_civil(year, month, day));
    }
    match text {
        b"infinity" => return Ok(DATE_POS_INFINITY),
        b"-infinity" => return Ok(DATE_NEG_INFINITY),
        _ => {}
    }
    let mut cursor = Cursor::new(text);
    let (year, month, day, _) = date_parts(&mut cursor)?;
    let year = if cursor.eat_str(b" BC") { 1 - year } else { year };
    if !cursor.done() {
        return Err(DECLINED);
    }
    Ok(days_from_civil(year, month, day))
}

/// `pgtemporal.date_json`.
pub fn date_json(text: &[u8], out: &mut Vec<u8>) -> Result<(), Decline> {
    require_ascii(text)?;
    if text.len() == 10 || text == b"infinity" || text == b"-infinity" {
        out.push(b'"');
        out.extend_from_slice(text);
        out.push(b'"');
        return Ok(());
    }
    let (year, month, day) = civil_from_days(date_days(text)?);
    out.push(b'"');
    write_iso_year(year, out);
    use std::io::Write;
    let _ = write!(out, "-{:02}-{:02}\"", month, day);
    Ok(())
}

/// timestamp (`zoned` false) or timestamptz text -> microseconds since the epoch (UTC for
/// timestamptz, the wall clock for timestamp); ±infinity -> the int64 sentinels.
pub fn timestamp_micros(text: &[u8], zoned: bool) -> Result<i64, Decline> {
    require_ascii(text)?;
    match text {
        b"infinity" => return Ok(TIMESTAMP_POS_INFINITY),
        b"-infinity" => return Ok(TIMESTAMP_NEG_INFINITY),
        _ => {}
    }
    let mut cursor = Cursor::new(text);
    let (year, month, day, _) = date_parts(&mut cursor)?;
    if !cursor.eat(b' ') {
        return Err(DECLINED);
    }
    let hour = cursor.fixed(2).ok_or(DECLINED)?;
    let minute = if cursor.eat(b':') {
        cursor.fixed(2).ok_or(DECLINED)?
    } else {
        return Err(DECLINED);
    };
    let second = if cursor.eat(b':') {
        cursor.fixed(2).ok_or(DECLINED)?
    } else {
        return Err(DECLINED);
    };
    let fraction = cursor.fraction()?;
    let mut offset: Option<i64> = None;
    if let Some(&sign) = cursor.text.get(cursor.pos).filter(|&&b| b == b'+' || b == b'-') {
        cursor.pos += 1;
        let hours = cursor.fixed(2).ok_or(DECLINED)?;
        let mut seconds = hours * 3600;
        if cursor.eat(b':') {
            seconds += cursor.fixed(2).ok_or(DECLINED)? * 60;
            if cursor.eat(b':') {
                seconds += cursor.fixed(2).ok_or(DECLINED)?;
            }
        }
        offset = Some(if sign == b'+' { seconds } else { -seconds });
    }
    let year = if cursor.eat_str(b" BC") { 1 - year } else { year };
    if !cursor.done() {
        return Err(DECLINED);
    }
    // A naive text in a timestamptz column, or a zoned one in a timestamp column, makes the
    // reference subtract naive and aware datetimes (a TypeError, a data error) or not, by path.
    if offset.is_some() != zoned {
        return Err(DECLINED);
    }
    let days = i128::from(days_from_civil(year, month, day));
    let mut seconds = days * SECONDS_PER_DAY + i128::from(hour * 3600 + minute * 60 + second);
    seconds -= i128::from(offset.unwrap_or(0));
    let micros = seconds * MICROS_PER_SECOND + i128::from(fraction);
    if micros <= i128::from(i64::MIN) || micros >= i128::from(i64::MAX) {
        return Err(Decline("timestamp beyond the range of Avro's timestamp-micros"));
    }
    Ok(micros as i64)
}

/// `pgtemporal._with_fraction`: `HH:MM:SS` gets `.000000`, anything else is right-padded with
/// zeros to 15 characters (never cut).
fn write_with_fraction(clock: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(clock);
    if clock.len() == 8 {
        out.extend_from_slice(b".000000");
    } else if clock.len() < 15 {
        out.resize(out.len() + 15 - clock.len(), b'0');
    }
}

/// Python's `text[start:end]` on ASCII (indices clamped; an empty slice when start >= end).
fn py_slice(text: &[u8], start: usize, end: usize) -> &[u8] {
    let end = end.min(text.len());
    let start = start.min(end);
    &text[start..end]
}

fn micros_json(micros: i64, zone: &[u8], out: &mut Vec<u8>) {
    use std::io::Write;
    if micros == TIMESTAMP_POS_INFINITY {
        out.extend_from_slice(b"\"infinity\"");
        return;
    }
    if micros == TIMESTAMP_NEG_INFINITY {
        out.extend_from_slice(b"\"-infinity\"");
        return;
    }
    let micros = i128::from(micros);
    let days = micros.div_euclid(MICROS_PER_DAY) as i64;
    let of_day = micros.rem_euclid(MICROS_PER_DAY) as i64;
    let (year, month, day) = civil_from_days(days);
    let (seconds, fraction) = (of_day / 1_000_000, of_day % 1_000_000);
    out.push(b'"');
    write_iso_year(year, out);
    let _ = write!(
        out,
        "-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}",
        month,
        day,
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60,
        fraction
    );
    out.extend_from_slice(zone);
    out.push(b'"');
}

/// `pgtemporal.timestamp_json` / `timestamptz_json`.
pub fn timestamp_json(text: &[u8], zoned: bool, out: &mut Vec<u8>) -> Result<(), Decline> {
    require_ascii(text)?;
    if zoned {
        if text.ends_with(b"+00") && py_slice(text, 4, 5) == b"-" {
            out.push(b'"');
            out.extend_from_slice(py_slice(text, 0, 10));
            out.push(b'T');
            let end = text.len() - 3;
            write_with_fraction(py_slice(text, 11, end), out);
            out.extend_from_slice(b"Z\"");
            return Ok(());
        }
        let micros = timestamp_micros(text, true)?;
        micros_json(micros, b"Z", out);
        return Ok(());
    }
    if py_slice(text, 4, 5) == b"-" && py_slice(text, 10, 11) == b" " && !text.ends_with(b" BC") {
        out.push(b'"');
        out.extend_from_slice(py_slice(text, 0, 10));
        out.push(b'T');
        write_with_fraction(py_slice(text, 11, text.len()), out);
        out.push(b'"');
        return Ok(());
    }
    let micros = timestamp_micros(text, false)?;
    micros_json(micros, b"", out);
    Ok(())
}

/// time text -> microseconds after midnight (`pgtemporal.time_micros`; 24:00:00 allowed).
pub fn time_micros(text: &[u8]) -> Result<i64, Decline> {
    require_ascii(text)?;
    let mut cursor = Cursor::new(text);
    let hour = cursor.fixed(2).ok_or(DECLINED)?;
    let minute = if cursor.eat(b':') {
        cursor.fixed(2).ok_or(DECLINED)?
    } else {
        return Err(DECLINED);
    };
    let second = if cursor.eat(b':') {
        cursor.fixed(2).ok_or(DECLINED)?
    } else {
        return Err(DECLINED);
    };
    let fraction = cursor.fraction()?;
    if !cursor.done() {
        return Err(DECLINED);
    }
    Ok((hour * 3600 + minute * 60 + second) * 1_000_000 + fraction)
}

pub fn time_json(text: &[u8], out: &mut Vec<u8>) -> Result<(), Decline> {
    require_ascii(text)?;
    out.push(b'"');
    write_with_fraction(text, out);
    out.push(b'"');
    Ok(())
}

/// `([+-]?\d+) <unit>s? ?` at the cursor, or nothing (the cursor unmoved).
fn interval_unit(cursor: &mut Cursor<'_>, unit: &[u8]) -> Result<Option<i128>, Decline> {
    let start = cursor.pos;
    let negative = cursor.eat(b'-');
    if !negative {
        cursor.eat(b'+');
    }
    let digits_start = cursor.pos;
    while cursor.pos < cursor.text.len() && cursor.text[cursor.pos].is_ascii_digit() {
        cursor.pos += 1;
    }
    let digits = &cursor.text[digits_start..cursor.pos];
    if digits.is_empty() || !cursor.eat(b' ') || !cursor.eat_str(unit) {
        cursor.pos = start;
        return Ok(None);
    }
    cursor.eat(b's');
    cursor.eat(b' ');
    if digits.len() > 18 {
        return Err(DECLINED);
    }
    let value = digits.iter().fold(0i128, |v, d| v * 10 + i128::from(d - b'0'));
    Ok(Some(if negative { -value } else { value }))
}

/// IntervalStyle=postgres text -> (months, days, microseconds), `pgtemporal.interval_parts`.
pub fn interval_parts(text: &[u8]) -> Result<(i64, i64, i64), Decline> {
    require_ascii(text)?;
    if text.is_empty() {
        return Err(DECLINED);
    }
    let mut cursor = Cursor::new(text);
    let years = interval_unit(&mut cursor, b"year")?.unwrap_or(0);
    let months = interval_unit(&mut cursor, b"mon")?.unwrap_or(0);
    let days = interval_unit(&mut cursor, b"day")?.unwrap_or(0);
    let mut micros: i128 = 0;
    if !cursor.done() {
        let negative = cursor.eat(b'-');
        if !negative {
            cursor.eat(b'+');
        }
        let hours_start = cursor.pos;
        while cursor.pos < text.len() && text[cursor.pos].is_ascii_digit() {
            cursor.pos += 1;
        }
        let hour_digits = &text[hours_start..cursor.pos];
        if hour_digits.is_empty() || hour_digits.len() > 15 || !cursor.eat(b':') {
            return Err(DECLINED);
        }
        let hours = hour_digits
            .iter()
            .fold(0i128, |v, d| v * 10 + i128::from(d - b'0'));
        let minutes = cursor.fixed(2).ok_or(DECLINED)?;
        if !cursor.eat(b':') {
            return Err(DECLINED);
        }
        let seconds = cursor.fixed(2).ok_or(DECLINED)?;
        let fraction = cursor.fraction()?;
        if !cursor.done() {
            return Err(DECLINED);
        }
        micros =
            (hours * 3600 + i128::from(minutes * 60 + seconds)) * MICROS_PER_SECOND + i128::from(fraction);
        if negative {
            micros = -micros;
        }
    }
    let total_months = years * 12 + months;
    let fits = |v: i128| i64::try_from(v).map_err(|_| DECLINED);
    Ok((fits(total_months)?, fits(days)?, fits(micros)?))
}

/// `pgtemporal.interval_json`: ISO-8601 as Postgres writes it under IntervalStyle=iso_8601.
pub fn interval_json(text: &[u8], out: &mut Vec<u8>) -> Result<(), Decline> {
    use std::io::Write;
    let (months, days, micros) = interval_parts(text)?;
    // C's truncating division: every part carries the sign of its field.
    let (years, months) = (months / 12, months % 12);
    let (hours, rest) = (micros / 3_600_000_000, micros % 3_600_000_000);
    let (minutes, rest) = (rest / 60_000_000, rest % 60_000_000);
    if years == 0 && months == 0 && days == 0 && micros == 0 {
        out.extend_from_slice(b"\"PT0S\"");
        return Ok(());
    }
    out.extend_from_slice(b"\"P");
    for (value, unit) in [(years, 'Y'), (months, 'M'), (days, 'D')] {
        if value != 0 {
            let _ = write!(out, "{}{}", value, unit);
        }
    }
    if micros != 0 {
        out.push(b'T');
        for (value, unit) in [(hours, 'H'), (minutes, 'M')] {
            if value != 0 {
                let _ = write!(out, "{}{}", value, unit);
            }
        }
    }
    if rest != 0 {
        let magnitude = rest.unsigned_abs();
        let digits = format!("{}.{:06}", magnitude / 1_000_000, magnitude % 1_000_000);
        let digits = digits.trim_end_matches('0').trim_end_matches('.');
        if rest < 0 {
            out.push(b'-');
        }
        out.extend_from_slice(digits.as_bytes());
        out.push(b'S');
    }
    out.push(b'"');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json<F: Fn(&[u8], &mut Vec<u8>) -> Result<(), Decline>>(f: F, text: &str) -> String {
        let mut out = Vec::new();
        f(text.as_bytes(), &mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn civil_days_round_trip() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2024, 2, 29), 19782);
        assert_eq!(days_from_civil(10000, 1, 1), 2932897);
        for days in [
            -1_000_000_000i64,
            -735160,
            -1,
            0,
            1,
            19782,
            2932897,
            2_000_000_000,
        ] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
    }

    #[test]
    fn dates_bc_far_future_and_infinities() {
        assert_eq!(date_days(b"2024-02-29").unwrap(), 19782);
        assert_eq!(date_days(b"0044-03-15 BC").unwrap(), -735160);
        assert_eq!(date_days(b"10000-01-01").unwrap(), 2932897);
        assert_eq!(date_days(b"infinity").unwrap(), i64::from(i32::MAX));
        assert_eq!(date_days(b"-infinity").unwrap(), i64::from(i32::MIN));
        assert!(date_days(b"2023-02-29").is_err());
        assert!(date_days(b"0000-01-01").is_err());
        assert!(date_days(b"2024-W01-1").is_err());
        assert!(date_days(b"24-01-01").is_err());
        assert_eq!(json(date_json, "0044-03-15 BC"), "\"-0043-03-15\"");
        assert_eq!(json(date_json, "10000-01-01"), "\"+10000-01-01\"");
        assert_eq!(json(date_json, "2024-02-29"), "\"2024-02-29\"");
    }

    #[test]
    fn timestamps_with_offsets() {
        let base = timestamp_micros(b"2024-01-02 03:04:05.5+00", true).unwrap();
        assert_eq!(base, 1_704_164_645_500_000);
        assert_eq!(
            timestamp_micros(b"2024-01-02 08:34:05.5+05:30", true).unwrap(),
            base
        );
        assert_eq!(
            timestamp_micros(b"2024-01-01 22:10:37.5-04:53:28", true).unwrap(),
            base
        );
        assert_eq!(timestamp_micros(b"2024-01-02 03:04:05.5", false).unwrap(), base);
        assert!(timestamp_micros(b"2024-01-02 03:04:05.5", true).is_err());
        assert!(timestamp_micros(b"2024-01-02 03:04:05.5+00", false).is_err());
        assert!(timestamp_micros(b"2024-01-02T03:04:05", false).is_err());
        assert!(timestamp_micros(b"2024-01-02 03:04:05.1234567", false).is_err());
        assert_eq!(timestamp_micros(b"infinity", true).unwrap(), i64::MAX);
        assert_eq!(timestamp_micros(b"-infinity", false).unwrap(), i64::MIN);
        assert!(timestamp_micros(b"294277-01-01 00:00:00", false).is_err());
        let bc = timestamp_micros(b"0044-03-15 12:00:00+00 BC", true).unwrap();
        assert_eq!(bc, (-735160i64 * 86400 + 12 * 3600) * 1_000_000);
    }

    #[test]
    fn timestamp_json_fast_and_slow_paths() {
        let tz = |t: &[u8], o: &mut Vec<u8>| timestamp_json(t, true, o);
        let naive = |t: &[u8], o: &mut Vec<u8>| timestamp_json(t, false, o);
        assert_eq!(
            json(tz, "2024-01-02 03:04:05.5+00"),
            "\"2024-01-02T03:04:05.500000Z\""
        );
        assert_eq!(
            json(tz, "2024-01-02 08:34:05+05:30"),
            "\"2024-01-02T03:04:05.000000Z\""
        );
        assert_eq!(json(tz, "infinity"), "\"infinity\"");
        assert_eq!(
            json(naive, "2024-01-02 03:04:05"),
            "\"2024-01-02T03:04:05.000000\""
        );
        assert_eq!(
            json(naive, "0044-03-15 12:00:00 BC"),
            "\"-0043-03-15T12:00:00.000000\""
        );
        assert_eq!(
            json(naive, "12345-01-01 00:00:00.25"),
            "\"+12345-01-01T00:00:00.250000\""
        );
    }

    #[test]
    fn times_and_24_00() {
        assert_eq!(time_micros(b"24:00:00").unwrap(), 86_400_000_000);
        assert_eq!(time_micros(b"04:05:06.789").unwrap(), 14_706_789_000);
        assert!(time_micros(b"4:05:06").is_err());
        assert_eq!(json(time_json, "04:05:06.789"), "\"04:05:06.789000\"");
        assert_eq!(json(time_json, "24:00:00"), "\"24:00:00.000000\"");
    }

    #[test]
    fn intervals_postgres_style() {
        assert_eq!(
            interval_parts(b"1 year 2 mons -3 days +04:05:06.5").unwrap(),
            (14, -3, 14_706_500_000)
        );
        assert_eq!(interval_parts(b"00:00:00").unwrap(), (0, 0, 0));
        assert_eq!(interval_parts(b"-1 days -00:00:00.000001").unwrap(), (0, -1, -1));
        assert_eq!(interval_parts(b"3 mons").unwrap(), (3, 0, 0));
        assert!(interval_parts(b"").is_err());
        assert!(interval_parts(b"@ 1 hour").is_err());
        assert!(interval_parts(b"P1Y").is_err());
        assert_eq!(
            json(interval_json, "1 year 2 mons -3 days +04:05:06.5"),
            "\"P1Y2M-3DT4H5M6.5S\""
        );
        assert_eq!(json(interval_json, "00:00:00"), "\"PT0S\"");
        assert_eq!(json(interval_json, "-00:00:01.25"), "\"PT-1.25S\"");
        assert_eq!(json(interval_json, "-13 mons"), "\"P-1Y-1M\"");
    }
}

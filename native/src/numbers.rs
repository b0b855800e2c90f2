//! Numbers: integers, floats, Avro decimals (numeric(p, s), the decimal mode, money).
//!
//! Every parser accepts only the canonical text Postgres's output functions write. Anything else
//! is declined (`Decline`): the caller then leaves the row to the Python reference, which either
//! raises the exact data error or writes what it writes. So the native path can be stricter than
//! the reference, never more lenient.

use crate::Decline;

/// `-?[0-9]+` -> i64 (int2, int4, int8, oid). Python's `int()` also takes `+1`, ` 1`, `1_0`, ...:
/// those are declined, as are values outside i64.
pub fn parse_int(text: &[u8]) -> Result<i64, Decline> {
    let (negative, digits) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 {
        return Err(Decline("integer text is not canonical"));
    }
    let mut value: i128 = 0;
    for &byte in digits {
        if !byte.is_ascii_digit() {
            return Err(Decline("integer text is not canonical"));
        }
        value = value * 10 + i128::from(byte - b'0');
    }
    if negative {
        value = -value;
    }
    i64::try_from(value).map_err(|_| Decline("integer outside int64"))
}

fn is_float_syntax(text: &[u8]) -> bool {
    // -?(digits[.digits]|.digits)([eE][+-]?digits)?   (what float8out/float4out write)
    let mut pos = usize::from(text.first() == Some(&b'-'));
    let int_start = pos;
    while pos < text.len() && text[pos].is_ascii_digit() {
        pos += 1;
    }
    let mut mantissa_digits = pos - int_start;
    if pos < text.len() && text[pos] == b'.' {
        pos += 1;
        let fraction_start = pos;
        while pos < text.len() && text[pos].is_ascii_digit() {
            pos += 1;
        }
        mantissa_digits += pos - fraction_start;
    }
    if mantissa_digits == 0 {
        return false;
    }
    if pos < text.len() && (text[pos] == b'e' || text[pos] == b'E') {
        pos += 1;
        if pos < text.len() && (text[pos] == b'+' || text[pos] == b'-') {
            pos += 1;
        }
        let exponent_start = pos;
        while pos < text.len() && text[pos].is_ascii_digit() {
            pos += 1;
        }
        if pos == exponent_start {
            return false;
        }
    }
    pos == text.len()
}

/// float4/float8 text -> the f64 Python's `float()` gives (both round correctly).
pub fn parse_double(text: &[u8]) -> Result<f64, Decline> {
    match text {
        b"NaN" => return Ok(f64::NAN),
        b"Infinity" => return Ok(f64::INFINITY),
        b"-Infinity" => return Ok(f64::NEG_INFINITY),
        _ => {}
    }
    if text.len() > 400 || !is_float_syntax(text) {
        return Err(Decline("float text is not canonical"));
    }
    // is_float_syntax admits ASCII only, so this is valid UTF-8.
    let text = std::str::from_utf8(text).map_err(|_| Decline("float text is not UTF-8"))?;
    text.parse::<f64>()
        .map_err(|_| Decline("float text is not canonical"))
}

/// float4: Python packs `float(text)` with `struct.pack('<f')`, which rounds the double to the
/// nearest float and raises OverflowError when a finite value becomes infinite (declined here).
pub fn parse_float4(text: &[u8]) -> Result<f32, Decline> {
    let double = parse_double(text)?;
    let single = double as f32;
    if single.is_infinite() && double.is_finite() {
        return Err(Decline("float too large for float4"));
    }
    Ok(single)
}

/// JSON of a float: `pgtext.float_json`, the text itself when its last character is a digit, else
/// quoted (NaN, Infinity).
pub fn float_json(text: &[u8], out: &mut Vec<u8>) -> Result<(), Decline> {
    match text.last() {
        None => Err(Decline("empty float text")),
        Some(last) if last.is_ascii_digit() => {
            out.extend_from_slice(text);
            Ok(())
        }
        Some(_) => {
            out.push(b'"');
            out.extend_from_slice(text);
            out.push(b'"');
            Ok(())
        }
    }
}

/// An exact integer of any size given by its decimal digits, written as Avro decimal bytes:
/// big-endian two's complement in `(bit_length(|n|) + 8) // 8` bytes, the size Python's
/// `int.to_bytes` gets from `pgtext.decimal_bytes`.
pub fn write_decimal_bytes(negative: bool, digits: &[u8], out: &mut Vec<u8>) {
    let digits = strip_leading_zeros(digits);
    if digits.len() <= 38 {
        let mut magnitude: u128 = 0;
        for &d in digits {
            magnitude = magnitude * 10 + u128::from(d - b'0');
        }
        let bits = 128 - magnitude.leading_zeros() as usize;
        let size = (bits + 8) / 8;
        // |n| < 10^38 < 2^127, so the signed value fits i128.
        let value = if negative {
            -(magnitude as i128)
        } else {
            magnitude as i128
        };
        let bytes = value.to_be_bytes();
        crate::avro::write_bytes(out, &bytes[16 - size..]);
        return;
    }
    // Arbitrary precision (numeric(1000, s)): base-2^32 limbs, least significant first.
    let mut limbs: Vec<u32> = Vec::with_capacity(digits.len() / 9 + 1);
    for chunk in digits.chunks(9) {
        let mut chunk_value: u64 = 0;
        for &d in chunk {
            chunk_value = chunk_value * 10 + u64::from(d - b'0');
        }
        let multiplier = 10u64.pow(chunk.len() as u32);
        let mut carry = chunk_value;
        for limb in limbs.iter_mut() {
            let product = u64::from(*limb) * multiplier + carry;
            *limb = product as u32;
            carry = product >> 32;
        }
        if carry > 0 {
            limbs.push(carry as u32);
        }
    }
    while limbs.last() == Some(&0) {
        limbs.pop();
    }
    let bits = match limbs.last() {
        None => 0,
        Some(top) => (limbs.len() - 1) * 32 + (32 - top.leading_zeros() as usize),
    };
    let size = (bits + 8) / 8;
    let mut bytes = vec![0u8; size];
    for (index, byte) in bytes.iter_mut().rev().enumerate() {
        let limb = limbs.get(index / 4).copied().unwrap_or(0);
        *byte = (limb >> ((index % 4) * 8)) as u8;
    }
    if negative {
        for byte in bytes.iter_mut() {
            *byte = !*byte;
        }
        for byte in bytes.iter_mut().rev() {
            let (sum, overflow) = byte.overflowing_add(1);
            *byte = sum;
            if !overflow {
                break;
            }
        }
    }
    crate::avro::write_bytes(out, &bytes);
}

fn strip_leading_zeros(digits: &[u8]) -> &[u8] {
    let first = digits.iter().position(|&d| d != b'0').unwrap_or(digits.len());
    &digits[first..]
}

/// numeric text -> Avro decimal(precision, scale) bytes, as `pgtext.decimal_converter` computes
/// them. Declined: anything but `-?digits[.digits]` (NaN, ±Infinity), a nonzero fraction digit
/// past `scale`, more than `precision` digits: the reference raises the data error for those.
pub fn write_decimal(
    text: &[u8],
    precision: u32,
    scale: u32,
    digits: &mut Vec<u8>,
    out: &mut Vec<u8>,
) -> Result<(), Decline> {
    let (negative, body) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let (whole, fraction) = match body.iter().position(|&b| b == b'.') {
        Some(point) => (&body[..point], &body[point + 1..]),
        None => (body, &body[body.len()..]),
    };
    if whole.is_empty()
        || !whole.iter().all(u8::is_ascii_digit)
        || (fraction.is_empty() && whole.len() != body.len())
        || !fraction.iter().all(u8::is_ascii_digit)
    {
        return Err(Decline("numeric text has no Avro decimal representation"));
    }
    let scale = scale as usize;
    let significant_fraction = fraction.len() - fraction.iter().rev().take_while(|&&d| d == b'0').count();
    if significant_fraction > scale {
        return Err(Decline("numeric has more fraction digits than the scale"));
    }
    digits.clear();
    digits.extend_from_slice(whole);
    let kept = fraction.len().min(scale);
    digits.extend_from_slice(&fraction[..kept]);
    digits.resize(digits.len() + (scale - kept), b'0');
    if strip_leading_zeros(digits).len() > precision as usize {
        return Err(Decline("numeric has more digits than the precision"));
    }
    write_decimal_bytes(negative, digits, out);
    Ok(())
}

/// money in lc_monetary=C, `(-?)\$([\d,]+)\.(\d\d)` -> sign, digits (commas dropped, cents kept).
fn money_parts<'t>(text: &'t [u8], digits: &mut Vec<u8>) -> Result<(bool, &'t [u8], &'t [u8]), Decline> {
    let (negative, rest) = match text.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, text),
    };
    let rest = rest
        .strip_prefix(b"$")
        .ok_or(Decline("money text is not in the C locale's format"))?;
    if rest.len() < 4 || rest[rest.len() - 3] != b'.' {
        return Err(Decline("money text is not in the C locale's format"));
    }
    let (whole, cents) = (&rest[..rest.len() - 3], &rest[rest.len() - 2..]);
    if !whole.iter().all(|&b| b.is_ascii_digit() || b == b',') || !cents.iter().all(u8::is_ascii_digit) {
        return Err(Decline("money text is not in the C locale's format"));
    }
    digits.clear();
    digits.extend(whole.iter().copied().filter(|&b| b != b','));
    digits.extend_from_slice(cents);
    Ok((negative, whole, cents))
}

/// money -> Avro decimal(19, 2) bytes (`pgtext.money_to_decimal`: no precision check).
pub fn write_money(text: &[u8], digits: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<(), Decline> {
    let (negative, _, _) = money_parts(text, digits)?;
    write_decimal_bytes(negative, digits, out);
    Ok(())
}

/// money -> `"-1234.56"` (`pgtext.money_json`).
pub fn money_json(text: &[u8], digits: &mut Vec<u8>, out: &mut Vec<u8>) -> Result<(), Decline> {
    let (negative, whole, cents) = money_parts(text, digits)?;
    out.push(b'"');
    if negative {
        out.push(b'-');
    }
    out.extend(whole.iter().copied().filter(|&b| b != b','));
    out.push(b'.');
    out.extend_from_slice(cents);
    out.push(b'"');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decimal(text: &str, precision: u32, scale: u32) -> Result<Vec<u8>, Decline> {
        let (mut digits, mut out) = (Vec::new(), Vec::new());
        write_decimal(text.as_bytes(), precision, scale, &mut digits, &mut out)?;
        Ok(out)
    }

    #[test]
    fn integers_are_canonical_only() {
        assert_eq!(parse_int(b"-32768").unwrap(), -32768);
        assert_eq!(parse_int(b"9223372036854775807").unwrap(), i64::MAX);
        assert_eq!(parse_int(b"-9223372036854775808").unwrap(), i64::MIN);
        for bad in [
            &b""[..],
            b"-",
            b"+1",
            b" 1",
            b"1_0",
            b"9223372036854775808",
            b"1.0",
            b"12345678901234567890",
        ] {
            assert!(parse_int(bad).is_err(), "{:?}", bad);
        }
    }

    #[test]
    fn floats_round_like_python() {
        assert_eq!(parse_double(b"1.1").unwrap(), 1.1);
        assert_eq!(parse_double(b"1e+100").unwrap(), 1e100);
        assert_eq!(parse_double(b"-1.2345679e-05").unwrap(), -1.2345679e-05);
        assert!(parse_double(b"NaN").unwrap().is_nan());
        assert_eq!(parse_double(b"-Infinity").unwrap(), f64::NEG_INFINITY);
        assert_eq!(parse_float4(b"1.1").unwrap(), 1.1f64 as f32);
        for bad in [
            &b""[..],
            b"inf",
            b"nan",
            b"1e",
            b".",
            b"-",
            b"1.0x",
            b" 1",
            b"infinity",
        ] {
            assert!(parse_double(bad).is_err(), "{:?}", bad);
        }
        assert!(parse_float4(b"1e300").is_err());
        let mut out = Vec::new();
        float_json(b"-Infinity", &mut out).unwrap();
        float_json(b"1.5", &mut out).unwrap();
        assert_eq!(out, b"\"-Infinity\"1.5");
    }

    #[test]
    fn decimals_are_twos_complement_sized_like_python() {
        // (unscaled).to_bytes((bit_length + 8) // 8, "big", signed=True), length-prefixed.
        assert_eq!(decimal("-1234.50", 10, 2).unwrap(), [0x06, 0xFE, 0x1D, 0xC6]);
        assert_eq!(decimal("0.00", 10, 2).unwrap(), [0x02, 0x00]);
        assert_eq!(decimal("-0.00", 10, 2).unwrap(), [0x02, 0x00]);
        assert_eq!(decimal("-1.28", 10, 2).unwrap(), [0x04, 0xFF, 0x80]);
        assert_eq!(decimal("1.27", 10, 2).unwrap(), [0x02, 0x7F]);
        assert_eq!(decimal("1.28", 10, 2).unwrap(), [0x04, 0x00, 0x80]);
        assert_eq!(
            decimal("999900", 6, 0).unwrap(),
            decimal("999900.000", 6, 0).unwrap()
        );
        assert_eq!(decimal("12", 5, 2).unwrap(), decimal("12.00", 5, 2).unwrap());
    }

    #[test]
    fn decimals_decline_what_the_reference_refuses() {
        assert!(decimal("NaN", 10, 2).is_err());
        assert!(decimal("Infinity", 10, 2).is_err());
        assert!(decimal("1.234", 10, 2).is_err());
        assert!(decimal("123456", 5, 0).is_err());
        assert!(decimal("12345", 5, 0).is_ok());
        assert!(decimal("1.", 5, 0).is_err());
        assert!(decimal(".5", 5, 1).is_err());
        assert!(decimal("+5", 5, 1).is_err());
        assert!(decimal("1e5", 9, 1).is_err());
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn big_decimals_match_python() {
        // Expected: n.to_bytes((n.bit_length() + 8) // 8, "big", signed=True), from CPython.
        let cases = [
            (format!("1{}", "0".repeat(37)), "0785ee10d5da46d900f436a000000000"),
            (format!("1{}", "0".repeat(38)), "4b3b4ca85a86c47a098a224000000000"),
            ("9".repeat(40), "1d6329f1c35ca4bfabb9f560ffffffffff"),
            (
                format!("-{}", "9".repeat(40)),
                "e29cd60e3ca35b4054460a9f0000000001",
            ),
            // -(2**135): a power of two, where the signed size is not the minimal one.
            (
                "-43556142965880123323311949751266331066368".to_string(),
                "ff8000000000000000000000000000000000",
            ),
        ];
        for (digits, expected) in cases {
            let out = decimal(&digits, 1000, 0).unwrap();
            assert_eq!(usize::from(out[0]) / 2, out.len() - 1, "{digits}");
            assert_eq!(hex(&out[1..]), expected, "{digits}");
        }
    }

    #[test]
    fn money_in_the_c_locale() {
        let (mut digits, mut out) = (Vec::new(), Vec::new());
        money_json(b"-$1,234.56", &mut digits, &mut out).unwrap();
        assert_eq!(out, b"\"-1234.56\"");
        out.clear();
        write_money(b"-$1,234.56", &mut digits, &mut out).unwrap();
        assert_eq!(out, [0x06, 0xFE, 0x1D, 0xC0]);
        assert!(write_money(b"1234.56", &mut digits, &mut out).is_err());
        assert!(write_money(b"$1.234,56", &mut digits, &mut out).is_err());
        assert!(write_money(b"$12.3", &mut digits, &mut out).is_err());
    }
}

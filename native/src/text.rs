//! Strings, bytes and the composite texts: JSON string escaping (`json.encoder.encode_basestring`),
//! bytea hex and base64, one-dimensional arrays (`pgtext.array_items`) and hstore (psycopg2's
//! `HstoreAdapter.parse`, as `pgtext.hstore_value` calls it).

use crate::Decline;

/// `json.encoder.encode_basestring`: quotes, backslash-escapes `"` and `\`, short escapes for
/// `\b \f \n \r \t`, `\u00xx` for the other control characters, everything else (non-ASCII
/// included) as it is.
pub fn write_json_string(text: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(text.len() + 2);
    out.push(b'"');
    let mut run_start = 0;
    for (index, &byte) in text.iter().enumerate() {
        if byte >= 0x20 && byte != b'"' && byte != b'\\' {
            continue;
        }
        out.extend_from_slice(&text[run_start..index]);
        run_start = index + 1;
        match byte {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0C => out.extend_from_slice(b"\\f"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            _ => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(byte >> 4)]);
                out.push(HEX[usize::from(byte & 0xF)]);
            }
        }
    }
    out.extend_from_slice(&text[run_start..]);
    out.push(b'"');
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// bytea hex output `\x00ff` -> its bytes into `out` (`pgtext.bytea_value`; the escape format and
/// anything `bytes.fromhex` would read only with its whitespace rules are declined).
pub fn bytea_bytes(text: &[u8], out: &mut Vec<u8>) -> Result<(), Decline> {
    let hex = text
        .strip_prefix(b"\\x")
        .ok_or(Decline("bytea not in hex format"))?;
    if hex.len() % 2 != 0 {
        return Err(Decline("bytea hex of odd length"));
    }
    out.reserve(hex.len() / 2);
    for pair in hex.chunks_exact(2) {
        match (hex_value(pair[0]), hex_value(pair[1])) {
            (Some(high), Some(low)) => out.push(high << 4 | low),
            _ => return Err(Decline("bytea hex holds a non-hex character")),
        }
    }
    Ok(())
}

/// Standard base64 with padding, no newline (`binascii.b2a_base64(..., newline=False)`).
pub fn write_base64(data: &[u8], out: &mut Vec<u8>) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    out.reserve(data.len().div_ceil(3) * 4);
    let mut chunks = data.chunks_exact(3);
    for chunk in &mut chunks {
        let n = u32::from(chunk[0]) << 16 | u32::from(chunk[1]) << 8 | u32::from(chunk[2]);
        for shift in [18, 12, 6, 0] {
            out.push(ALPHABET[(n >> shift & 63) as usize]);
        }
    }
    match *chunks.remainder() {
        [a] => {
            let n = u32::from(a) << 16;
            out.extend_from_slice(&[
                ALPHABET[(n >> 18 & 63) as usize],
                ALPHABET[(n >> 12 & 63) as usize],
                b'=',
                b'=',
            ]);
        }
        [a, b] => {
            let n = u32::from(a) << 16 | u32::from(b) << 8;
            out.extend_from_slice(&[
                ALPHABET[(n >> 18 & 63) as usize],
                ALPHABET[(n >> 12 & 63) as usize],
                ALPHABET[(n >> 6 & 63) as usize],
                b'=',
            ]);
        }
        _ => {}
    }
}

/// Where an item's text lives: in the value itself, or unescaped into the scratch store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece {
    Null,
    Value(usize, usize),
    Store(usize, usize),
}

impl Piece {
    pub fn get<'a>(self, value: &'a [u8], store: &'a [u8]) -> Option<&'a [u8]> {
        match self {
            Piece::Null => None,
            Piece::Value(start, end) => Some(&value[start..end]),
            Piece::Store(start, end) => Some(&store[start..end]),
        }
    }
}

/// A quoted item `"..."` starting at `pos` (on the quote): backslash escapes, the backslash never
/// followed by a newline (the reference's `\\.` does not match one). Returns the position after
/// the closing quote.
fn quoted(text: &[u8], mut pos: usize, store: &mut Vec<u8>) -> Result<(Piece, usize), Decline> {
    pos += 1;
    let start = pos;
    let mut escaped = false;
    while pos < text.len() {
        match text[pos] {
            b'"' => break,
            b'\\' => {
                if text.get(pos + 1).is_none_or(|&b| b == b'\n') {
                    return Err(Decline("unreadable quoted item"));
                }
                escaped = true;
                pos += 2;
            }
            _ => pos += 1,
        }
    }
    if pos >= text.len() {
        return Err(Decline("unterminated quoted item"));
    }
    let raw = &text[start..pos];
    if !escaped {
        return Ok((Piece::Value(start, pos), pos + 1));
    }
    let store_start = store.len();
    let mut index = 0;
    while index < raw.len() {
        if raw[index] == b'\\' {
            index += 1;
        }
        store.push(raw[index]);
        index += 1;
    }
    Ok((Piece::Store(store_start, store.len()), pos + 1))
}

/// A one-dimensional array's text output -> its items (`pgtext.array_items`). Declined: explicit
/// bounds, several dimensions and every irregular text (the reference raises for them).
pub fn array_items(
    text: &[u8],
    delimiter: u8,
    items: &mut Vec<Piece>,
    store: &mut Vec<u8>,
) -> Result<(), Decline> {
    items.clear();
    store.clear();
    if text.len() < 2 || text[0] != b'{' || text[text.len() - 1] != b'}' || text[1] == b'{' {
        return Err(Decline("array with explicit bounds or several dimensions"));
    }
    let (inner_start, inner_end) = (1, text.len() - 1);
    if inner_start == inner_end {
        return Ok(());
    }
    let inner = &text[inner_start..inner_end];
    let bare = |start: usize, end: usize| {
        if &text[start..end] == b"NULL" {
            Piece::Null
        } else {
            Piece::Value(start, end)
        }
    };
    if !inner.contains(&b'"') {
        // `inner.split(delimiter)`: empty items included, nothing unescaped.
        let mut start = inner_start;
        for (offset, &byte) in inner.iter().enumerate() {
            if byte == delimiter {
                items.push(bare(start, inner_start + offset));
                start = inner_start + offset + 1;
            }
        }
        items.push(bare(start, inner_end));
        return Ok(());
    }
    let mut pos = inner_start;
    loop {
        if pos < inner_end && text[pos] == b'"' {
            let (piece, next) = quoted(&text[..inner_end], pos, store)?;
            items.push(piece);
            pos = next;
        } else {
            let start = pos;
            while pos < inner_end && !matches!(text[pos], b'"' | b'{' | b'}') && text[pos] != delimiter {
                pos += 1;
            }
            if pos == start {
                return Err(Decline("unreadable array text"));
            }
            items.push(bare(start, pos));
        }
        if pos == inner_end {
            return Ok(());
        }
        if text[pos] != delimiter {
            return Err(Decline("unreadable array text"));
        }
        pos += 1;
    }
}

/// hstore's canonical output `"k"=>"v", "n"=>NULL` -> (key, value) pieces. Only the exact
/// separators Postgres writes are accepted, and duplicate keys are declined (the reference's dict
/// keeps the first position with the last value).
pub fn hstore_pairs(
    text: &[u8],
    pairs: &mut Vec<(Piece, Piece)>,
    store: &mut Vec<u8>,
) -> Result<(), Decline> {
    pairs.clear();
    store.clear();
    let mut pos = 0;
    while pos < text.len() {
        if text[pos] != b'"' {
            return Err(Decline("unreadable hstore"));
        }
        let (key, next) = quoted(text, pos, store)?;
        pos = next;
        if !text[pos..].starts_with(b"=>") {
            return Err(Decline("unreadable hstore"));
        }
        pos += 2;
        let value = if text[pos..].starts_with(b"NULL") {
            pos += 4;
            Piece::Null
        } else if text.get(pos) == Some(&b'"') {
            let (value, next) = quoted(text, pos, store)?;
            pos = next;
            value
        } else {
            return Err(Decline("unreadable hstore"));
        };
        pairs.push((key, value));
        if pos == text.len() {
            break;
        }
        if !text[pos..].starts_with(b", ") || pos + 2 == text.len() {
            return Err(Decline("unreadable hstore"));
        }
        pos += 2;
    }
    if pairs.len() > 1 {
        let mut keys: Vec<&[u8]> = pairs
            .iter()
            .map(|(k, _)| k.get(text, store).unwrap_or(b""))
            .collect();
        keys.sort_unstable();
        if keys.windows(2).any(|w| w[0] == w[1]) {
            return Err(Decline("hstore with duplicate keys"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn items(text: &str, delimiter: u8) -> Result<Vec<Option<String>>, Decline> {
        let (mut pieces, mut store) = (Vec::new(), Vec::new());
        array_items(text.as_bytes(), delimiter, &mut pieces, &mut store)?;
        Ok(pieces
            .iter()
            .map(|p| {
                p.get(text.as_bytes(), &store)
                    .map(|b| String::from_utf8(b.to_vec()).unwrap())
            })
            .collect())
    }

    #[test]
    fn json_strings_escape_like_encode_basestring() {
        let mut out = Vec::new();
        write_json_string("Zoë \"q\"\\\n\t\u{1}\u{7f}".as_bytes(), &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "\"Zoë \\\"q\\\"\\\\\\n\\t\\u0001\u{7f}\""
        );
    }

    #[test]
    fn bytea_and_base64() {
        let mut out = Vec::new();
        bytea_bytes(b"\\x00ff00", &mut out).unwrap();
        assert_eq!(out, [0, 255, 0]);
        let mut b64 = Vec::new();
        write_base64(&out, &mut b64);
        assert_eq!(b64, b"AP8A");
        for (data, expected) in [
            (&b""[..], &b""[..]),
            (b"f", b"Zg=="),
            (b"fo", b"Zm8="),
            (b"foo", b"Zm9v"),
        ] {
            let mut b64 = Vec::new();
            write_base64(data, &mut b64);
            assert_eq!(b64, expected);
        }
        assert!(bytea_bytes(b"\\000", &mut out).is_err());
        assert!(bytea_bytes(b"\\x0", &mut out).is_err());
        assert!(bytea_bytes(b"\\x0g", &mut out).is_err());
    }

    #[test]
    fn arrays_bare_quoted_null_and_box() {
        assert_eq!(
            items("{1,NULL,3}", b',').unwrap(),
            [Some("1".into()), None, Some("3".into())]
        );
        assert_eq!(items("{}", b',').unwrap(), Vec::<Option<String>>::new());
        assert_eq!(
            items(r#"{"a b",NULL,"x\"y","NULL"}"#, b',').unwrap(),
            [Some("a b".into()), None, Some("x\"y".into()), Some("NULL".into())]
        );
        assert_eq!(
            items("{(3,4),(1,2);(1,1),(0,0)}", b';').unwrap(),
            [Some("(3,4),(1,2)".into()), Some("(1,1),(0,0)".into())]
        );
        assert_eq!(
            items("{a,,b}", b',').unwrap(),
            [Some("a".into()), Some("".into()), Some("b".into())]
        );
        for bad in [
            "{{1,2},{3,4}}",
            "[0:1]={1,2}",
            "{",
            "}",
            r#"{"a",}"#,
            r#"{"a"b}"#,
            r#"{"a}"#,
            r#"{"a\"}"#,
        ] {
            assert!(items(bad, b',').is_err(), "{bad}");
        }
    }

    #[test]
    fn hstore_canonical_only() {
        let text = br#""a"=>"1", "b"=>NULL, "c\"d"=>"e\\f""#;
        let (mut pairs, mut store) = (Vec::new(), Vec::new());
        hstore_pairs(text, &mut pairs, &mut store).unwrap();
        let got: Vec<(Vec<u8>, Option<Vec<u8>>)> = pairs
            .iter()
            .map(|(k, v)| {
                (
                    k.get(text, &store).unwrap().to_vec(),
                    v.get(text, &store).map(<[u8]>::to_vec),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (b"a".to_vec(), Some(b"1".to_vec())),
                (b"b".to_vec(), None),
                (b"c\"d".to_vec(), Some(b"e\\f".to_vec()))
            ]
        );
        hstore_pairs(b"", &mut pairs, &mut store).unwrap();
        assert!(pairs.is_empty());
        for bad in [
            &br#""a"=>"1","b"=>"2""#[..],
            br#""a" => "1""#,
            br#""a"=>"1", "#,
            br#""a"=>"1", "a"=>"2""#,
            b"a=>b",
        ] {
            assert!(hstore_pairs(bad, &mut pairs, &mut store).is_err());
        }
    }
}

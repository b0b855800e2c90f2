//! COPY TEXT rows, as `core/pgtypes/copy_text.py` parses them: a line per row, tab-separated
//! fields, `\N` for NULL (only in a line holding a backslash, where the reference looks for it),
//! backslash escapes including `\b \f \v`, 1-3 octal digits (low 8 bits kept) and `\x` with 1-2
//! hex digits, then UTF-8 validation of every value.

use crate::{Cell, Decline};

fn unescape(field: &[u8], out: &mut Vec<u8>) -> Result<(), Decline> {
    let mut pos = 0;
    while pos < field.len() {
        let byte = field[pos];
        pos += 1;
        if byte != b'\\' {
            out.push(byte);
            continue;
        }
        let Some(&escaped) = field.get(pos) else {
            return Err(Decline("COPY field ends with a lone backslash"));
        };
        pos += 1;
        match escaped {
            b'0'..=b'7' => {
                let mut value = u32::from(escaped - b'0');
                let end = (pos + 2).min(field.len());
                while pos < end && (b'0'..=b'7').contains(&field[pos]) {
                    value = value * 8 + u32::from(field[pos] - b'0');
                    pos += 1;
                }
                out.push((value & 0xFF) as u8);
            }
            b'x' if field.get(pos).is_some_and(u8::is_ascii_hexdigit) => {
                let end = (pos + 2).min(field.len());
                let mut value = 0u8;
                while pos < end && field[pos].is_ascii_hexdigit() {
                    value = value * 16 + (field[pos] as char).to_digit(16).unwrap_or(0) as u8;
                    pos += 1;
                }
                out.push(value);
            }
            b'b' => out.push(0x08),
            b'f' => out.push(0x0C),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(0x0B),
            other => out.push(other),
        }
    }
    Ok(())
}

/// One line (without its newline) at `buf[start..end]` -> its cells, appended to `cells`;
/// unescaped values go to `scratch`. Declined: invalid UTF-8, a lone trailing backslash.
pub fn parse_line(
    buf: &[u8],
    start: usize,
    end: usize,
    cells: &mut Vec<Cell>,
    scratch: &mut Vec<u8>,
) -> Result<(), Decline> {
    let line = &buf[start..end];
    if !line.contains(&b'\\') {
        std::str::from_utf8(line).map_err(|_| Decline("COPY line is not valid UTF-8"))?;
        let mut field_start = start;
        for (offset, &byte) in line.iter().enumerate() {
            if byte == b'\t' {
                cells.push(Cell::Input(field_start, start + offset));
                field_start = start + offset + 1;
            }
        }
        cells.push(Cell::Input(field_start, end));
        return Ok(());
    }
    let mut field_start = start;
    for position in start..=end {
        if position < end && buf[position] != b'\t' {
            continue;
        }
        let field = &buf[field_start..position];
        if field == b"\\N" {
            cells.push(Cell::Null);
        } else if field.contains(&b'\\') {
            let scratch_start = scratch.len();
            unescape(field, scratch)?;
            std::str::from_utf8(&scratch[scratch_start..])
                .map_err(|_| Decline("COPY field is not valid UTF-8 once unescaped"))?;
            cells.push(Cell::Scratch(scratch_start, scratch.len()));
        } else {
            std::str::from_utf8(field).map_err(|_| Decline("COPY field is not valid UTF-8"))?;
            cells.push(Cell::Input(field_start, position));
        }
        field_start = position + 1;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &[u8]) -> Result<Vec<Option<Vec<u8>>>, Decline> {
        let (mut cells, mut scratch) = (Vec::new(), Vec::new());
        parse_line(line, 0, line.len(), &mut cells, &mut scratch)?;
        Ok(cells
            .iter()
            .map(|cell| match *cell {
                Cell::Null | Cell::Toast => None,
                Cell::Input(s, e) => Some(line[s..e].to_vec()),
                Cell::Scratch(s, e) => Some(scratch[s..e].to_vec()),
            })
            .collect())
    }

    #[test]
    fn plain_lines_split_on_tabs() {
        assert_eq!(
            parse(b"1\tab\t").unwrap(),
            [Some(b"1".to_vec()), Some(b"ab".to_vec()), Some(b"".to_vec())]
        );
        // Without a backslash in the line there is no NULL marker to find.
        assert_eq!(parse(b"N").unwrap(), [Some(b"N".to_vec())]);
    }

    #[test]
    fn escapes_and_nulls() {
        assert_eq!(
            parse(b"\\N\ta\\tb\\\\c\t\\N\\n").unwrap(),
            [None, Some(b"a\tb\\c".to_vec()), Some(b"N\n".to_vec())]
        );
        assert_eq!(
            parse(b"\\101\\x41\\x4a1\\8\\b\\v\\f").unwrap(),
            [Some(b"AAJ18\x08\x0b\x0c".to_vec())]
        );
        assert_eq!(parse(b"\\1010\\0").unwrap(), [Some(b"A0\x00".to_vec())]);
        assert_eq!(parse(b"\\xg").unwrap(), [Some(b"xg".to_vec())]);
        assert_eq!(parse(b"\\303\\251").unwrap(), [Some("é".as_bytes().to_vec())]);
    }

    #[test]
    fn bad_bytes_are_declined() {
        assert!(parse(b"a\\").is_err());
        assert!(parse(b"\xff").is_err());
        assert!(parse(b"a\t\\377").is_err());
        assert!(
            parse(b"\\777").is_err(),
            "octal keeps the low 8 bits: 0xff, not UTF-8"
        );
        assert!(parse(b"\xc3").is_err());
    }
}

//! The row messages of pgoutput (Insert, Update, Delete; protocol 1, and 2 inside a stream), read
//! with a bounds check on every access: a truncated or corrupted buffer is an `Err` naming the
//! byte offset, never a panic or an out-of-bounds read.

use crate::Cell;

pub const INSERT: u8 = b'I';
pub const UPDATE: u8 = b'U';
pub const DELETE: u8 = b'D';
pub const NEW_TUPLE: u8 = b'N';
pub const KEY_TUPLE: u8 = b'K';
pub const OLD_TUPLE: u8 = b'O';
const TEXT: u8 = b't';
const NULL: u8 = b'n';
const UNCHANGED_TOAST: u8 = b'u';
const BINARY: u8 = b'b';

/// Why a message was not read, and where.
#[derive(Debug, PartialEq, Eq)]
pub struct Unreadable {
    pub reason: &'static str,
    pub offset: usize,
}

fn fail<T>(reason: &'static str, offset: usize) -> Result<T, Unreadable> {
    Err(Unreadable { reason, offset })
}

/// One row message: its cells are `cells[old]` (the old tuple, when `old_kind` is K or O) and
/// `cells[new]` (Insert and Update; empty for a Delete).
#[derive(Debug)]
pub struct RowMessage {
    pub op: u8,
    pub relation_oid: u32,
    pub old_kind: u8,
    pub old: std::ops::Range<usize>,
    pub new: std::ops::Range<usize>,
}

struct Reader<'b> {
    buf: &'b [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u8(&mut self) -> Result<u8, Unreadable> {
        let byte = *self.buf.get(self.pos).ok_or(Unreadable {
            reason: "truncated",
            offset: self.pos,
        })?;
        self.pos += 1;
        Ok(byte)
    }
    fn u16(&mut self) -> Result<u16, Unreadable> {
        let bytes = self.buf.get(self.pos..self.pos + 2).ok_or(Unreadable {
            reason: "truncated",
            offset: self.pos,
        })?;
        self.pos += 2;
        Ok(u16::from_be_bytes([bytes[0], bytes[1]]))
    }
    fn u32(&mut self) -> Result<u32, Unreadable> {
        let bytes = self.buf.get(self.pos..self.pos + 4).ok_or(Unreadable {
            reason: "truncated",
            offset: self.pos,
        })?;
        self.pos += 4;
        Ok(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// TupleData: Int16 count, then per column its kind byte and, for text, Int32 length + bytes.
    fn tuple(&mut self, cells: &mut Vec<Cell>) -> Result<std::ops::Range<usize>, Unreadable> {
        let first = cells.len();
        let count = self.u16()?;
        for _ in 0..count {
            let at = self.pos;
            match self.u8()? {
                TEXT => {
                    let length = self.u32()? as usize;
                    let start = self.pos;
                    let end = start.checked_add(length).filter(|&end| end <= self.buf.len());
                    let Some(end) = end else {
                        return fail("truncated (a length runs past the end)", at);
                    };
                    if std::str::from_utf8(&self.buf[start..end]).is_err() {
                        return fail("a text column is not valid UTF-8", start);
                    }
                    cells.push(Cell::Input(start, end));
                    self.pos = end;
                }
                NULL => cells.push(Cell::Null),
                UNCHANGED_TOAST => cells.push(Cell::Toast),
                BINARY => {
                    return fail(
                        "a binary-format column (only text format is encoded natively)",
                        at,
                    )
                }
                _ => return fail("unknown column kind", at),
            }
        }
        Ok(first..cells.len())
    }
}

/// Reads one Insert, Update or Delete payload (the whole XLogData payload, type byte first).
/// `in_stream`: between Stream Start and Stream Stop of protocol 2, where an xid follows the type.
pub fn read_row_message(
    buf: &[u8],
    in_stream: bool,
    cells: &mut Vec<Cell>,
) -> Result<RowMessage, Unreadable> {
    let mut reader = Reader { buf, pos: 0 };
    let op = reader.u8()?;
    if op != INSERT && op != UPDATE && op != DELETE {
        return fail("not an Insert, Update or Delete message", 0);
    }
    if in_stream {
        reader.u32()?;
    }
    let relation_oid = reader.u32()?;
    let kind_at = reader.pos;
    let kind = reader.u8()?;
    let empty = cells.len()..cells.len();
    let message = match op {
        INSERT => {
            if kind != NEW_TUPLE {
                return fail("an Insert's tuple is not 'N'", kind_at);
            }
            let new = reader.tuple(cells)?;
            RowMessage {
                op,
                relation_oid,
                old_kind: 0,
                old: empty,
                new,
            }
        }
        UPDATE => match kind {
            NEW_TUPLE => {
                let new = reader.tuple(cells)?;
                RowMessage {
                    op,
                    relation_oid,
                    old_kind: 0,
                    old: empty,
                    new,
                }
            }
            KEY_TUPLE | OLD_TUPLE => {
                let old = reader.tuple(cells)?;
                let new_at = reader.pos;
                if reader.u8()? != NEW_TUPLE {
                    return fail("an Update's new tuple is not 'N'", new_at);
                }
                let new = reader.tuple(cells)?;
                RowMessage {
                    op,
                    relation_oid,
                    old_kind: kind,
                    old,
                    new,
                }
            }
            _ => return fail("an Update's tuple kind is not 'K', 'O' or 'N'", kind_at),
        },
        _ => {
            if kind != KEY_TUPLE && kind != OLD_TUPLE {
                return fail("a Delete's tuple kind is not 'K' or 'O'", kind_at);
            }
            let old = reader.tuple(cells)?;
            let end = cells.len();
            RowMessage {
                op,
                relation_oid,
                old_kind: kind,
                old,
                new: end..end,
            }
        }
    };
    if reader.pos != buf.len() {
        return fail("trailing bytes after the tuple", reader.pos);
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(value: &[u8]) -> Vec<u8> {
        let mut out = vec![TEXT];
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value);
        out
    }

    fn insert(columns: &[Vec<u8>]) -> Vec<u8> {
        let mut out = vec![INSERT];
        out.extend_from_slice(&16384u32.to_be_bytes());
        out.push(NEW_TUPLE);
        out.extend_from_slice(&(columns.len() as u16).to_be_bytes());
        for column in columns {
            out.extend_from_slice(column);
        }
        out
    }

    #[test]
    fn reads_an_insert() {
        let buf = insert(&[text(b"42"), vec![NULL], text("é".as_bytes())]);
        let mut cells = Vec::new();
        let message = read_row_message(&buf, false, &mut cells).unwrap();
        assert_eq!(
            (message.op, message.relation_oid, message.new.clone()),
            (INSERT, 16384, 0..3)
        );
        assert_eq!(cells[1], Cell::Null);
    }

    #[test]
    fn reads_updates_and_deletes() {
        let mut buf = vec![UPDATE];
        buf.extend_from_slice(&7u32.to_be_bytes());
        buf.push(KEY_TUPLE);
        buf.extend_from_slice(&2u16.to_be_bytes());
        buf.extend_from_slice(&text(b"1"));
        buf.push(NULL);
        buf.push(NEW_TUPLE);
        buf.extend_from_slice(&2u16.to_be_bytes());
        buf.extend_from_slice(&text(b"2"));
        buf.push(UNCHANGED_TOAST);
        let mut cells = Vec::new();
        let message = read_row_message(&buf, false, &mut cells).unwrap();
        assert_eq!(
            (message.old_kind, message.old.clone(), message.new.clone()),
            (KEY_TUPLE, 0..2, 2..4)
        );
        assert_eq!(cells[3], Cell::Toast);

        let mut delete = vec![DELETE];
        delete.extend_from_slice(&9u32.to_be_bytes()); // the xid inside a stream
        delete.extend_from_slice(&7u32.to_be_bytes());
        delete.push(OLD_TUPLE);
        delete.extend_from_slice(&1u16.to_be_bytes());
        delete.extend_from_slice(&text(b"1"));
        let message = read_row_message(&delete, true, &mut cells).unwrap();
        assert_eq!(
            (message.op, message.relation_oid, message.old.len()),
            (DELETE, 7, 1)
        );
    }

    #[test]
    fn every_truncation_and_corruption_is_an_error_not_a_panic() {
        let buf = insert(&[text(b"42"), vec![NULL], text(b"hello"), vec![UNCHANGED_TOAST]]);
        let mut cells = Vec::new();
        for cut in 0..buf.len() {
            assert!(
                read_row_message(&buf[..cut], false, &mut cells).is_err(),
                "cut at {cut}"
            );
        }
        let mut padded = buf.clone();
        padded.push(0);
        assert_eq!(
            read_row_message(&padded, false, &mut cells).unwrap_err().reason,
            "trailing bytes after the tuple"
        );
        // Flip every byte to every value: whatever comes out, no panic.
        for index in 0..buf.len() {
            for value in 0..=255u8 {
                let mut corrupt = buf.clone();
                corrupt[index] = value;
                cells.clear();
                let _ = read_row_message(&corrupt, false, &mut cells);
            }
        }
        let mut huge = insert(&[text(b"42")]);
        huge[9..13].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(read_row_message(&huge, false, &mut cells).is_err());
        assert!(read_row_message(&insert(&[text(b"\xff")]), false, &mut cells).is_err());
        assert!(read_row_message(b"B", false, &mut cells).is_err());
    }
}

//! A relation version's compiled plan: a kind per column, the key, the output format and framing;
//! and the batch loops that turn COPY lines or pgoutput row messages into key and value bytes, all
//! written into one output buffer (the Python objects are made afterwards, once per message).

use crate::avro::{self, END_OF_BLOCKS, NULL_BRANCH, VALUE_BRANCH};
use crate::pgoutput::{self, RowMessage};
use crate::text::{self, Piece};
use crate::{copy_text, numbers, temporal, Cell, Decline};

/// How one column type is published: the reference's `ColumnType` converters, by family.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Bool,
    /// int2, int4, int8, oid: Avro int/long (the same zigzag varint), JSON the text itself.
    Int,
    Float4,
    Float8,
    /// numeric(p, s), a domain over one, or numeric under the decimal mode: Avro decimal bytes
    /// (precision and scale already the Avro ones), JSON the text quoted.
    Decimal {
        precision: u32,
        scale: u32,
    },
    /// uuid, numeric without typmod: Avro string, JSON the text quoted (never needs escaping).
    Quoted,
    Money,
    /// Every text-like and unmapped type: Avro string, JSON escaped string.
    Text,
    /// json, jsonb: Avro string, JSON the value itself.
    Raw,
    Bytea,
    Date,
    Timestamp,
    Timestamptz,
    Time,
    Interval,
    Hstore,
    /// A one-dimensional array of a non-array kind, items split on `delimiter`.
    Array {
        delimiter: u8,
        element: Box<Kind>,
    },
}

impl Kind {
    /// The glue's kind spec: `int`, `decimal:<precision>:<scale>`, `array:<delimiter>:<element>`, ...
    pub fn parse(spec: &str) -> Result<Kind, String> {
        Ok(match spec {
            "bool" => Kind::Bool,
            "int" => Kind::Int,
            "float4" => Kind::Float4,
            "float8" => Kind::Float8,
            "quoted" => Kind::Quoted,
            "money" => Kind::Money,
            "text" => Kind::Text,
            "raw" => Kind::Raw,
            "bytea" => Kind::Bytea,
            "date" => Kind::Date,
            "timestamp" => Kind::Timestamp,
            "timestamptz" => Kind::Timestamptz,
            "time" => Kind::Time,
            "interval" => Kind::Interval,
            "hstore" => Kind::Hstore,
            _ => {
                if let Some(rest) = spec.strip_prefix("decimal:") {
                    let (precision, scale) =
                        rest.split_once(':').ok_or_else(|| format!("bad kind {spec:?}"))?;
                    let precision = precision.parse().map_err(|_| format!("bad kind {spec:?}"))?;
                    let scale = scale.parse().map_err(|_| format!("bad kind {spec:?}"))?;
                    Kind::Decimal { precision, scale }
                } else if let Some(rest) = spec.strip_prefix("array:") {
                    let bytes = rest.as_bytes();
                    if bytes.len() < 3 || bytes[1] != b':' || !matches!(bytes[0], b',' | b';') {
                        return Err(format!("bad kind {spec:?}"));
                    }
                    let element = Kind::parse(&rest[2..])?;
                    if matches!(element, Kind::Array { .. }) {
                        return Err(format!("unsupported kind {spec:?}: arrays of arrays"));
                    }
                    Kind::Array {
                        delimiter: bytes[0],
                        element: Box::new(element),
                    }
                } else {
                    return Err(format!("unsupported kind {spec:?}"));
                }
            }
        })
    }
}

/// Reusable buffers for the composite kinds (no allocation per value once warm).
#[derive(Default)]
pub struct Scratch {
    digits: Vec<u8>,
    bytes: Vec<u8>,
    items: Vec<Piece>,
    store: Vec<u8>,
    pairs: Vec<(Piece, Piece)>,
}

fn avro_scalar(
    kind: &Kind,
    text: &[u8],
    out: &mut Vec<u8>,
    digits: &mut Vec<u8>,
    bytes: &mut Vec<u8>,
) -> Result<(), Decline> {
    match kind {
        Kind::Bool => match text {
            b"t" => out.push(1),
            b"f" => out.push(0),
            _ => return Err(Decline("bool text is not t or f")),
        },
        Kind::Int => avro::write_long(out, numbers::parse_int(text)?),
        Kind::Float4 => avro::write_float(out, numbers::parse_float4(text)?),
        Kind::Float8 => avro::write_double(out, numbers::parse_double(text)?),
        Kind::Decimal { precision, scale } => numbers::write_decimal(text, *precision, *scale, digits, out)?,
        Kind::Quoted | Kind::Text | Kind::Raw => avro::write_bytes(out, text),
        Kind::Money => numbers::write_money(text, digits, out)?,
        Kind::Bytea => {
            bytes.clear();
            text::bytea_bytes(text, bytes)?;
            avro::write_bytes(out, bytes);
        }
        Kind::Date => avro::write_long(out, temporal::date_days(text)?),
        Kind::Timestamp => avro::write_long(out, temporal::timestamp_micros(text, false)?),
        Kind::Timestamptz => avro::write_long(out, temporal::timestamp_micros(text, true)?),
        Kind::Time => avro::write_long(out, temporal::time_micros(text)?),
        Kind::Interval => {
            let (months, days, micros) = temporal::interval_parts(text)?;
            avro::write_long(out, months);
            avro::write_long(out, days);
            avro::write_long(out, micros);
        }
        Kind::Hstore | Kind::Array { .. } => return Err(Decline("composite kind in scalar position")),
    }
    Ok(())
}

fn json_scalar(
    kind: &Kind,
    text: &[u8],
    out: &mut Vec<u8>,
    digits: &mut Vec<u8>,
    bytes: &mut Vec<u8>,
) -> Result<(), Decline> {
    match kind {
        Kind::Bool => match text {
            b"t" => out.extend_from_slice(b"true"),
            b"f" => out.extend_from_slice(b"false"),
            _ => return Err(Decline("bool text is not t or f")),
        },
        Kind::Int | Kind::Raw => out.extend_from_slice(text),
        Kind::Float4 | Kind::Float8 => numbers::float_json(text, out)?,
        Kind::Decimal { .. } | Kind::Quoted => {
            out.push(b'"');
            out.extend_from_slice(text);
            out.push(b'"');
        }
        Kind::Money => numbers::money_json(text, digits, out)?,
        Kind::Text => text::write_json_string(text, out),
        Kind::Bytea => {
            bytes.clear();
            text::bytea_bytes(text, bytes)?;
            out.push(b'"');
            text::write_base64(bytes, out);
            out.push(b'"');
        }
        Kind::Date => temporal::date_json(text, out)?,
        Kind::Timestamp => temporal::timestamp_json(text, false, out)?,
        Kind::Timestamptz => temporal::timestamp_json(text, true, out)?,
        Kind::Time => temporal::time_json(text, out)?,
        Kind::Interval => temporal::interval_json(text, out)?,
        Kind::Hstore | Kind::Array { .. } => return Err(Decline("composite kind in scalar position")),
    }
    Ok(())
}

/// One non-null value as Avro (without the union branch).
pub fn avro_value(kind: &Kind, text: &[u8], out: &mut Vec<u8>, scratch: &mut Scratch) -> Result<(), Decline> {
    let Scratch {
        digits,
        bytes,
        items,
        store,
        pairs,
    } = scratch;
    match kind {
        Kind::Array { delimiter, element } => {
            text::array_items(text, *delimiter, items, store)?;
            if !items.is_empty() {
                avro::write_count(out, items.len());
                for item in items.iter() {
                    match item.get(text, store) {
                        None => out.push(NULL_BRANCH),
                        Some(item) => {
                            out.push(VALUE_BRANCH);
                            avro_scalar(element, item, out, digits, bytes)?;
                        }
                    }
                }
            }
            out.push(END_OF_BLOCKS);
            Ok(())
        }
        Kind::Hstore => {
            text::hstore_pairs(text, pairs, store)?;
            if !pairs.is_empty() {
                avro::write_count(out, pairs.len());
                for (key, value) in pairs.iter() {
                    avro::write_bytes(out, key.get(text, store).unwrap_or(b""));
                    match value.get(text, store) {
                        None => out.push(NULL_BRANCH),
                        Some(value) => {
                            out.push(VALUE_BRANCH);
                            avro::write_bytes(out, value);
                        }
                    }
                }
            }
            out.push(END_OF_BLOCKS);
            Ok(())
        }
        _ => avro_scalar(kind, text, out, digits, bytes),
    }
}

/// One non-null value as JSON text.
pub fn json_value(kind: &Kind, text: &[u8], out: &mut Vec<u8>, scratch: &mut Scratch) -> Result<(), Decline> {
    let Scratch {
        digits,
        bytes,
        items,
        store,
        pairs,
    } = scratch;
    match kind {
        Kind::Array { delimiter, element } => {
            text::array_items(text, *delimiter, items, store)?;
            out.push(b'[');
            for (index, item) in items.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                match item.get(text, store) {
                    None => out.extend_from_slice(b"null"),
                    Some(item) => json_scalar(element, item, out, digits, bytes)?,
                }
            }
            out.push(b']');
            Ok(())
        }
        Kind::Hstore => {
            text::hstore_pairs(text, pairs, store)?;
            out.push(b'{');
            for (index, (key, value)) in pairs.iter().enumerate() {
                if index > 0 {
                    out.push(b',');
                }
                text::write_json_string(key.get(text, store).unwrap_or(b""), out);
                out.push(b':');
                match value.get(text, store) {
                    None => out.extend_from_slice(b"null"),
                    Some(value) => text::write_json_string(value, out),
                }
            }
            out.push(b'}');
            Ok(())
        }
        _ => json_scalar(kind, text, out, digits, bytes),
    }
}

/// One output message's bytes in the batch buffer: `None` for an absent key or value.
pub type Span = Option<(usize, usize)>;

/// What a row or change turned into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Encoded {
    /// `c`, `u`, `d` (pgoutput) or `r` (snapshot)
    pub op: u8,
    pub key: Span,
    pub value: Span,
    /// An event that takes a `seq` but is not published: the delete of an unkeyed table.
    pub skipped: bool,
    /// Columns named in `bw.unchanged`: `unchanged[unchanged_range]`.
    pub unchanged: std::ops::Range<usize>,
}

/// Where a batch stopped: the item the native path declines, for the Python reference to take.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stop {
    /// Index of the line (COPY) or payload (pgoutput) in the batch.
    pub index: usize,
    /// COPY: the line is `buf[line_start..line_end]`, the next one starts at `next`.
    pub line_start: usize,
    pub line_end: usize,
    pub next: usize,
    pub reason: String,
}

#[derive(Default)]
pub struct Batch {
    pub out: Vec<u8>,
    pub rows: Vec<Encoded>,
    /// How many input items each entry of `rows` came from, per item (pgoutput: 1 or 2 events).
    pub events_per_item: Vec<u8>,
    pub unchanged: Vec<u16>,
    pub stop: Option<Stop>,
}

pub struct Plan {
    pub relation: String,
    pub relation_oid: u32,
    pub kinds: Vec<Kind>,
    pub names: Vec<String>,
    /// `encode_basestring(name)` of every column, from the glue.
    pub json_names: Vec<Vec<u8>>,
    pub key_indexes: Vec<usize>,
    pub identity: Vec<bool>,
    pub key_in_identity: bool,
    pub avro: bool,
    pub key_prefix: Vec<u8>,
    pub value_prefix: Vec<u8>,
}

fn cell_text<'a>(cell: Cell, input: &'a [u8], scratch: &'a [u8]) -> Option<&'a [u8]> {
    match cell {
        Cell::Input(start, end) => Some(&input[start..end]),
        Cell::Scratch(start, end) => Some(&scratch[start..end]),
        Cell::Null | Cell::Toast => None,
    }
}

impl Plan {
    /// The key record (Avro, with its framing) or object (JSON) of `row`'s key columns.
    fn write_key(
        &self,
        row: &[Cell],
        input: &[u8],
        cells: &[u8],
        out: &mut Vec<u8>,
        scratch: &mut Scratch,
    ) -> Result<(), Decline> {
        if self.avro {
            out.extend_from_slice(&self.key_prefix);
        }
        for (position, &index) in self.key_indexes.iter().enumerate() {
            let text = cell_text(row[index], input, cells)
                .ok_or(Decline("a key column is NULL or unchanged TOAST"))?;
            if self.avro {
                avro_value(&self.kinds[index], text, out, scratch)?;
            } else {
                out.push(if position == 0 { b'{' } else { b',' });
                out.extend_from_slice(&self.json_names[index]);
                out.push(b':');
                json_value(&self.kinds[index], text, out, scratch)?;
            }
        }
        if !self.avro {
            if self.key_indexes.is_empty() {
                out.extend_from_slice(b"{}");
            } else {
                out.push(b'}');
            }
        }
        Ok(())
    }

    /// The value record or object of `row`; unchanged TOAST is written as null.
    fn write_value(
        &self,
        row: &[Cell],
        input: &[u8],
        cells: &[u8],
        out: &mut Vec<u8>,
        scratch: &mut Scratch,
    ) -> Result<(), Decline> {
        if self.avro {
            out.extend_from_slice(&self.value_prefix);
            for (index, kind) in self.kinds.iter().enumerate() {
                match cell_text(row[index], input, cells) {
                    None => out.push(NULL_BRANCH),
                    Some(text) => {
                        out.push(VALUE_BRANCH);
                        avro_value(kind, text, out, scratch)?;
                    }
                }
            }
            return Ok(());
        }
        if self.kinds.is_empty() {
            out.extend_from_slice(b"{}");
            return Ok(());
        }
        for (index, kind) in self.kinds.iter().enumerate() {
            out.push(if index == 0 { b'{' } else { b',' });
            out.extend_from_slice(&self.json_names[index]);
            out.push(b':');
            match cell_text(row[index], input, cells) {
                None => out.extend_from_slice(b"null"),
                Some(text) => json_value(kind, text, out, scratch)?,
            }
        }
        out.push(b'}');
        Ok(())
    }

    /// Key (when keyed) and value of a complete row, appended to `batch`.
    #[allow(clippy::too_many_arguments)]
    fn encode_row(
        &self,
        op: u8,
        row: &[Cell],
        input: &[u8],
        cells: &[u8],
        batch: &mut Batch,
        scratch: &mut Scratch,
        unchanged: std::ops::Range<usize>,
    ) -> Result<(), Decline> {
        let key = if self.key_indexes.is_empty() {
            None
        } else {
            let start = batch.out.len();
            self.write_key(row, input, cells, &mut batch.out, scratch)?;
            Some((start, batch.out.len()))
        };
        let start = batch.out.len();
        self.write_value(row, input, cells, &mut batch.out, scratch)?;
        batch.rows.push(Encoded {
            op,
            key,
            value: Some((start, batch.out.len())),
            skipped: false,
            unchanged,
        });
        Ok(())
    }

    fn describe(&self, what: &str, index: usize, offset: usize, reason: &str) -> String {
        format!(
            "relation {} (OID {}): {} {} at byte {}: {}",
            self.relation, self.relation_oid, what, index, offset, reason
        )
    }

    /// COPY TEXT lines from `buf[start..]` (each ended by a newline; a last line without one is a
    /// row too) -> one `r` row each, until the end or the first line the native path declines.
    pub fn encode_copy(&self, buf: &[u8], start: usize) -> Batch {
        let mut batch = Batch::default();
        let mut scratch = Scratch::default();
        let mut cells: Vec<Cell> = Vec::with_capacity(self.kinds.len());
        let mut unescaped: Vec<u8> = Vec::new();
        let mut line_start = start.min(buf.len());
        let mut index = 0;
        while line_start < buf.len() {
            let (line_end, next) = match memchr_newline(&buf[line_start..]) {
                Some(offset) => (line_start + offset, line_start + offset + 1),
                None => (buf.len(), buf.len()),
            };
            cells.clear();
            unescaped.clear();
            let mark = batch.out.len();
            // A zero-column table's rows are empty lines (`COPY (SELECT FROM t)`): no fields at all,
            // as the snapshot reads them, not the one empty field COPY TEXT would say.
            let parsed = if self.kinds.is_empty() {
                Ok(())
            } else {
                copy_text::parse_line(buf, line_start, line_end, &mut cells, &mut unescaped)
            };
            let result = parsed.and_then(|()| {
                if cells.len() != self.kinds.len() {
                    return Err(Decline(
                        "the line's field count is not the relation's column count",
                    ));
                }
                self.encode_row(b'r', &cells, buf, &unescaped, &mut batch, &mut scratch, 0..0)
            });
            if let Err(Decline(reason)) = result {
                batch.out.truncate(mark);
                batch.stop = Some(Stop {
                    index,
                    line_start,
                    line_end,
                    next,
                    reason: self.describe("COPY line", index, line_start, reason),
                });
                return batch;
            }
            batch.events_per_item.push(1);
            index += 1;
            line_start = next;
        }
        batch
    }

    fn same_values(&self, a: &[Cell], b: &[Cell], input: &[u8]) -> bool {
        a.iter().zip(b).all(|(x, y)| match (x, y) {
            (Cell::Null, Cell::Null) | (Cell::Toast, Cell::Toast) => true,
            (Cell::Input(..), Cell::Input(..)) => cell_text(*x, input, &[]) == cell_text(*y, input, &[]),
            _ => false,
        })
    }

    /// One Insert/Update/Delete -> its events, as the reference's assembler and serializer make
    /// them (an Update that changes the key: a tombstone for the old key, then the new row).
    fn encode_message(
        &self,
        buf: &[u8],
        in_stream: bool,
        cells: &mut Vec<Cell>,
        row: &mut Vec<Cell>,
        batch: &mut Batch,
        scratch: &mut Scratch,
    ) -> Result<u8, (&'static str, usize)> {
        cells.clear();
        let message: RowMessage =
            pgoutput::read_row_message(buf, in_stream, cells).map_err(|u| (u.reason, u.offset))?;
        if message.relation_oid != self.relation_oid {
            return Err(("the message is for another relation", 1));
        }
        let width = self.kinds.len();
        let declined = |Decline(reason): Decline| (reason, 0usize);
        let new = &cells[message.new.clone()];
        let old = &cells[message.old.clone()];
        if (message.op != pgoutput::DELETE && new.len() != width)
            || (message.old_kind != 0 && old.len() != width)
        {
            return Err(("the tuple's column count is not the relation's", 0));
        }
        let keyed = !self.key_indexes.is_empty();
        match message.op {
            pgoutput::INSERT => {
                if new.contains(&Cell::Toast) {
                    return Err(("unchanged TOAST in an Insert", 0));
                }
                self.encode_row(b'c', new, buf, &[], batch, scratch, 0..0)
                    .map_err(declined)?;
                Ok(1)
            }
            pgoutput::UPDATE => {
                row.clear();
                row.extend_from_slice(new);
                let unchanged_start = batch.unchanged.len();
                for index in 0..width {
                    if row[index] != Cell::Toast {
                        continue;
                    }
                    if message.old_kind != 0
                        && (message.old_kind == pgoutput::OLD_TUPLE || self.identity[index])
                        && old[index] != Cell::Toast
                    {
                        row[index] = old[index];
                        continue;
                    }
                    batch.unchanged.push(index as u16);
                }
                let unchanged = unchanged_start..batch.unchanged.len();
                if !keyed {
                    self.encode_row(b'u', row, buf, &[], batch, scratch, unchanged)
                        .map_err(declined)?;
                    return Ok(1);
                }
                let key: Vec<Cell> = self.key_indexes.iter().map(|&i| row[i]).collect();
                if key.contains(&Cell::Toast) {
                    return Err(("key columns left out as unchanged TOAST", 0));
                }
                if message.old_kind == 0 {
                    self.encode_row(b'u', row, buf, &[], batch, scratch, unchanged)
                        .map_err(declined)?;
                    return Ok(1);
                }
                if message.old_kind != pgoutput::OLD_TUPLE && !self.key_in_identity {
                    return Err(("the old tuple does not carry the key", 0));
                }
                let old_key: Vec<Cell> = self.key_indexes.iter().map(|&i| old[i]).collect();
                if self.same_values(&old_key, &key, buf) {
                    self.encode_row(b'u', row, buf, &[], batch, scratch, unchanged)
                        .map_err(declined)?;
                    return Ok(1);
                }
                let start = batch.out.len();
                self.write_key(old, buf, &[], &mut batch.out, scratch)
                    .map_err(declined)?;
                batch.rows.push(Encoded {
                    op: b'd',
                    key: Some((start, batch.out.len())),
                    value: None,
                    skipped: false,
                    unchanged: 0..0,
                });
                self.encode_row(b'c', row, buf, &[], batch, scratch, unchanged)
                    .map_err(declined)?;
                Ok(2)
            }
            _ => {
                if !keyed {
                    batch.rows.push(Encoded {
                        op: b'd',
                        key: None,
                        value: None,
                        skipped: true,
                        unchanged: 0..0,
                    });
                    return Ok(1);
                }
                if message.old_kind != pgoutput::OLD_TUPLE && !self.key_in_identity {
                    return Err(("the old tuple does not carry the key", 0));
                }
                let start = batch.out.len();
                self.write_key(old, buf, &[], &mut batch.out, scratch)
                    .map_err(declined)?;
                batch.rows.push(Encoded {
                    op: b'd',
                    key: Some((start, batch.out.len())),
                    value: None,
                    skipped: false,
                    unchanged: 0..0,
                });
                Ok(1)
            }
        }
    }

    /// pgoutput row messages -> their events, until the end or the first message declined.
    pub fn encode_changes(&self, payloads: &[&[u8]], in_stream: bool) -> Batch {
        let mut batch = Batch::default();
        let mut scratch = Scratch::default();
        let mut cells: Vec<Cell> = Vec::with_capacity(2 * self.kinds.len());
        let mut row: Vec<Cell> = Vec::with_capacity(self.kinds.len());
        for (index, payload) in payloads.iter().enumerate() {
            let (mark, rows, unchanged) = (batch.out.len(), batch.rows.len(), batch.unchanged.len());
            match self.encode_message(payload, in_stream, &mut cells, &mut row, &mut batch, &mut scratch) {
                Ok(events) => batch.events_per_item.push(events),
                Err((reason, offset)) => {
                    batch.out.truncate(mark);
                    batch.rows.truncate(rows);
                    batch.unchanged.truncate(unchanged);
                    batch.stop = Some(Stop {
                        index,
                        line_start: 0,
                        line_end: 0,
                        next: 0,
                        reason: self.describe("pgoutput message", index, offset, reason),
                    });
                    return batch;
                }
            }
        }
        batch
    }
}

fn memchr_newline(haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&b| b == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(kinds: &[&str], key: &[usize], avro: bool) -> Plan {
        let kinds: Vec<Kind> = kinds.iter().map(|k| Kind::parse(k).unwrap()).collect();
        let names: Vec<String> = (0..kinds.len()).map(|i| format!("c{i}")).collect();
        Plan {
            relation: "public.t".into(),
            relation_oid: 16384,
            json_names: names.iter().map(|n| format!("\"{n}\"").into_bytes()).collect(),
            identity: (0..kinds.len()).map(|i| key.contains(&i)).collect(),
            kinds,
            names,
            key_indexes: key.to_vec(),
            key_in_identity: true,
            avro,
            key_prefix: avro::confluent_prefix(1),
            value_prefix: avro::confluent_prefix(2),
        }
    }

    fn rows(batch: &Batch) -> Vec<(Option<Vec<u8>>, Option<Vec<u8>>)> {
        let get = |span: Span| span.map(|(s, e)| batch.out[s..e].to_vec());
        batch.rows.iter().map(|r| (get(r.key), get(r.value))).collect()
    }

    #[test]
    fn kinds_parse_and_refuse() {
        assert_eq!(
            Kind::parse("decimal:12:2").unwrap(),
            Kind::Decimal {
                precision: 12,
                scale: 2
            }
        );
        assert_eq!(
            Kind::parse("array:;:text").unwrap(),
            Kind::Array {
                delimiter: b';',
                element: Box::new(Kind::Text)
            }
        );
        assert!(Kind::parse("array:,:array:,:int").is_err());
        assert!(Kind::parse("geometry").is_err());
    }

    #[test]
    fn copy_rows_to_json_and_avro() {
        let json = plan(&["int", "text", "array:,:int"], &[0], false);
        let batch = json.encode_copy(b"1\ta\"b\t{1,NULL}\n2\t\\N\t{}\n", 0);
        assert_eq!(batch.stop, None);
        assert_eq!(
            rows(&batch),
            [
                (
                    Some(b"{\"c0\":1}".to_vec()),
                    Some(b"{\"c0\":1,\"c1\":\"a\\\"b\",\"c2\":[1,null]}".to_vec())
                ),
                (
                    Some(b"{\"c0\":2}".to_vec()),
                    Some(b"{\"c0\":2,\"c1\":null,\"c2\":[]}".to_vec())
                ),
            ]
        );
        let avro = plan(&["int", "text"], &[0], true);
        let batch = avro.encode_copy(b"-1\tab", 0);
        assert_eq!(
            rows(&batch),
            [(
                Some(vec![0, 0, 0, 0, 1, 0x01]),
                Some(vec![0, 0, 0, 0, 2, 2, 0x01, 2, 4, b'a', b'b'])
            )]
        );
    }

    #[test]
    fn zero_column_tables_publish_empty_objects() {
        let json = plan(&[], &[], false);
        let batch = json.encode_copy(b"\n\n", 0);
        assert_eq!(
            rows(&batch),
            [(None, Some(b"{}".to_vec())), (None, Some(b"{}".to_vec()))]
        );
    }

    #[test]
    fn copy_stops_at_the_first_declined_line() {
        let json = plan(&["int", "bool"], &[0], false);
        let buf = b"1\tt\n2\tx\n3\tf\n";
        let batch = json.encode_copy(buf, 0);
        assert_eq!(batch.rows.len(), 1);
        let stop = batch.stop.unwrap();
        assert_eq!(
            (stop.index, &buf[stop.line_start..stop.line_end], stop.next),
            (1, &b"2\tx"[..], 8)
        );
        assert!(stop.reason.contains("public.t"), "{}", stop.reason);
        let rest = json.encode_copy(buf, stop.next);
        assert_eq!(rest.rows.len(), 1);
        // NULL key, wrong width: declined, never written.
        assert!(json.encode_copy(b"\\N\tt\n", 0).stop.is_some());
        assert!(json.encode_copy(b"1\n", 0).stop.is_some());
    }
}

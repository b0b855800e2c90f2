//! A streamed transaction's changes written as the spool's records (`spool_records.py`) while its
//! chunks arrive, a run of payloads per call: the Kafka key and value encoded, what depends on the
//! commit (`bw.lsn`, `bw.seq`, `bw.commit_ts`) left for `spooled.rs` to add at the Stream Commit.

use std::ops::Range;

use crate::plan::{Batch, Plan};

const CHANGE: u8 = b'E';
const SKIP: u8 = b'S';

/// `len` as the record's signed length field, -1 for a null.
fn length(span: Option<&[u8]>) -> [u8; 4] {
    span.map_or(-1, |s| s.len() as i32).to_be_bytes()
}

/// Every event of `batch` (encoded by `plan`) as a spool record, all written into one buffer:
/// the buffer and each record's range in it. A change record is `>BBIiiHh` (kind, op, relation,
/// key length, value length, `bw.unchanged` length, key text count -1: none) then the key, the value
/// and the unchanged columns' names joined by commas; an event that takes a `seq` but publishes
/// nothing is `S`.
pub fn write(plan: &Plan, batch: &Batch) -> (Vec<u8>, Vec<Range<usize>>) {
    let mut out = Vec::with_capacity(batch.out.len() + 32 * batch.rows.len());
    let mut ranges = Vec::with_capacity(batch.rows.len());
    let mut unchanged = Vec::new();
    for event in &batch.rows {
        let start = out.len();
        if event.skipped {
            out.push(SKIP);
            ranges.push(start..out.len());
            continue;
        }
        let key = event.key.map(|(s, e)| &batch.out[s..e]);
        let value = event.value.map(|(s, e)| &batch.out[s..e]);
        unchanged.clear();
        for (n, &column) in batch.unchanged[event.unchanged.clone()].iter().enumerate() {
            if n > 0 {
                unchanged.push(b',');
            }
            unchanged.extend_from_slice(plan.names[usize::from(column)].as_bytes());
        }
        out.extend_from_slice(&[CHANGE, event.op]);
        out.extend_from_slice(&plan.relation_oid.to_be_bytes());
        out.extend_from_slice(&length(key));
        out.extend_from_slice(&length(value));
        out.extend_from_slice(&(unchanged.len() as u16).to_be_bytes());
        out.extend_from_slice(&(-1i16).to_be_bytes());
        out.extend_from_slice(key.unwrap_or_default());
        out.extend_from_slice(value.unwrap_or_default());
        out.extend_from_slice(&unchanged);
        ranges.push(start..out.len());
    }
    (out, ranges)
}

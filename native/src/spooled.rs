//! A committed streamed transaction's spool, produced in bulk: the records
//! `cdc_worker/core/changes/spool_records.py` wrote while the transaction ran (the Kafka key and
//! value already encoded) get the commit's `bw.*` headers here and go to the native producer, many
//! thousand per call from Python and without the GIL, instead of one `produce()` call each.
//!
//! Records come either as a list of `bytes` (the spool's memory head) or as one `bytes` block of
//! length-prefixed records (a block of the spool's file). This module takes the change (`E`) and
//! skip (`S`) records of relations the caller named a topic for, from a position on, and stops at
//! the first record it does not take: a kept pgoutput message, a refused or failed change, a change
//! carrying its key text (the re-snapshot's), a relation the caller has not named yet. The caller
//! handles that record with the Python reference and calls again after it, so every record keeps
//! its place and its `bw.seq`.

use std::collections::HashMap;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use rdkafka::message::{Header, Headers, OwnedHeaders};

use crate::detached;
use crate::producer::PyProducer;

/// `spool_records`' change record header: kind, op, relation OID, key length, value length,
/// `bw.unchanged` length, key text count (`>BBIiiHh`).
const CHANGE_HEAD: usize = 18;
const CHANGE: u8 = b'E';
const SKIP: u8 = b'S';
/// The length prefix of a record in a spool file block (big-endian u32).
const LENGTH: usize = 4;
/// Records taken per call at most, so that Python gets the hand back now and then.
pub const RECORDS_PER_CALL: usize = 1 << 16;

/// A record this module produces.
#[derive(Debug, PartialEq, Eq)]
pub enum Spooled<'a> {
    /// A change: its op (`c`, `u`, `d`), relation, key and value (None for a null), and the
    /// `bw.unchanged` header's value (empty when none).
    Change {
        op: u8,
        oid: u32,
        key: Option<&'a [u8]>,
        value: Option<&'a [u8]>,
        unchanged: &'a [u8],
    },
    /// An event that takes a `seq` and publishes nothing (the delete of an unkeyed table).
    Skip,
}

fn be_i32(bytes: &[u8]) -> i32 {
    i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// `length` bytes at `pos` (None for a negative length: a null), advancing `pos`; Err when the
/// record is shorter.
fn field<'a>(record: &'a [u8], pos: &mut usize, length: i32) -> Result<Option<&'a [u8]>, ()> {
    if length < 0 {
        return Ok(None);
    }
    let end = *pos + length as usize;
    let bytes = record.get(*pos..end).ok_or(())?;
    *pos = end;
    Ok(Some(bytes))
}

/// The record as this module produces it, or None for one it leaves to the caller (any other
/// kind, a change with key text, anything malformed: the Python reference reports that).
pub fn parse(record: &[u8]) -> Option<Spooled<'_>> {
    match *record.first()? {
        SKIP if record.len() == 1 => Some(Spooled::Skip),
        CHANGE => {
            let head = record.get(..CHANGE_HEAD)?;
            let op = head[1];
            let oid = u32::from_be_bytes([head[2], head[3], head[4], head[5]]);
            let unchanged_len = usize::from(u16::from_be_bytes([head[14], head[15]]));
            let texts = i16::from_be_bytes([head[16], head[17]]);
            if texts >= 0 || !matches!(op, b'c' | b'u' | b'd') {
                return None;
            }
            let mut pos = CHANGE_HEAD;
            let key = field(record, &mut pos, be_i32(&head[6..10])).ok()?;
            let value = field(record, &mut pos, be_i32(&head[10..14])).ok()?;
            let unchanged = record.get(pos..)?;
            if unchanged.len() != unchanged_len {
                return None;
            }
            Some(Spooled::Change {
                op,
                oid,
                key,
                value,
                unchanged,
            })
        }
        _ => None,
    }
}

/// The records of a block of length-prefixed records from byte `start` on, each with the bytes it
/// takes in the block; ends at the block's end (or at a record the block does not hold whole).
pub fn framed(block: &[u8], start: usize) -> impl Iterator<Item = (&[u8], usize)> {
    let mut pos = start;
    std::iter::from_fn(move || {
        let prefix = block.get(pos..pos + LENGTH)?;
        let length = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        let record = block.get(pos + LENGTH..pos + LENGTH + length)?;
        pos += LENGTH + length;
        Some((record, LENGTH + length))
    })
}

/// The records this module takes from the start of `records`, in order, up to the first it does
/// not (or whose relation `known` does not name), at most `limit`; and the bytes they span.
pub fn scan<'a>(
    records: impl Iterator<Item = (&'a [u8], usize)>,
    known: impl Fn(u32) -> bool,
    limit: usize,
) -> (Vec<Spooled<'a>>, usize) {
    let mut taken = Vec::new();
    let mut span = 0;
    for (record, size) in records.take(limit) {
        match parse(record) {
            Some(Spooled::Change { oid, .. }) if !known(oid) => break,
            Some(spooled) => taken.push(spooled),
            None => break,
        }
        span += size;
    }
    (taken, span)
}

/// The commit's headers every change of the transaction shares.
pub struct CommitHeaders<'a> {
    pub lsn: &'a [u8],
    pub xid: &'a [u8],
    pub commit_ts: &'a [u8],
}

/// One change's headers as the reference (`stream_encoding.replay`) writes them: `bw.op`,
/// `bw.lsn`, `bw.seq`, `bw.xid`, `bw.commit_ts`, then `bw.unchanged` when columns are left out.
/// Produced before its commit (`commit.lsn` empty: `stream_encoding.early_headers`), a change has
/// no `bw.lsn` nor `bw.commit_ts`: the commit event on the control topic gives them.
pub fn change_headers(op: &u8, seq: &[u8], commit: &CommitHeaders<'_>, unchanged: &[u8]) -> OwnedHeaders {
    let pairs: [(&str, &[u8]); 5] = [
        ("bw.op", std::slice::from_ref(op)),
        ("bw.lsn", commit.lsn),
        ("bw.seq", seq),
        ("bw.xid", commit.xid),
        ("bw.commit_ts", commit.commit_ts),
    ];
    let early = commit.lsn.is_empty();
    let capacity = pairs.len() + usize::from(!unchanged.is_empty());
    let headers = pairs
        .iter()
        .filter(|&&(key, _)| !(early && (key == "bw.lsn" || key == "bw.commit_ts")))
        .fold(OwnedHeaders::new_with_capacity(capacity), |all, &(key, value)| {
            all.insert(Header {
                key,
                value: Some(value),
            })
        });
    if unchanged.is_empty() {
        return headers;
    }
    headers.insert(Header {
        key: "bw.unchanged",
        value: Some(unchanged),
    })
}

/// Where a relation's changes go: its topic and the producer batch its reports are counted under.
pub type Target = (String, usize);

/// A change's message: topic, key, value, headers, batch.
pub type Message<'a> = (&'a str, Option<&'a [u8]>, Option<&'a [u8]>, OwnedHeaders, usize);

/// Each record with its `seq` (from `first_seq`, one per record) and, for a change, its message.
pub fn messages<'a>(
    records: &'a [Spooled<'a>],
    targets: &'a HashMap<u32, Target>,
    commit: &'a CommitHeaders<'a>,
    first_seq: u64,
) -> impl Iterator<Item = Option<Message<'a>>> + 'a {
    let mut seq_text = Vec::with_capacity(20);
    records.iter().zip(first_seq..).map(move |(record, seq)| {
        let Spooled::Change {
            op,
            oid,
            key,
            value,
            unchanged,
        } = record
        else {
            return None;
        };
        use std::io::Write;
        seq_text.clear();
        // Writing an integer into a Vec cannot fail.
        let _ = write!(seq_text, "{seq}");
        let (topic, batch) = &targets[oid];
        let headers = change_headers(op, &seq_text, commit, unchanged);
        Some((topic.as_str(), *key, *value, headers, *batch))
    })
}

/// What producing spooled records did: records taken (their `seq` numbers used), messages
/// produced per relation (`[inserts, updates, deletes]` and their key and value bytes), and the
/// messages librdkafka refused as `(relation, size, reason, too_large)`.
#[derive(Default)]
pub struct SpooledProduced {
    pub taken: usize,
    pub produced: HashMap<u32, ([u64; 3], usize)>,
    pub refused: Vec<(u32, usize, String, bool)>,
}

/// `records` produced in order; with `stop_on_refusal`, nothing after a refused message
/// (`taken` then counts up to it).
pub fn produce(
    producer: &PyProducer,
    records: &[Spooled<'_>],
    targets: &HashMap<u32, Target>,
    commit: &CommitHeaders<'_>,
    first_seq: u64,
    stop_on_refusal: bool,
) -> SpooledProduced {
    let mut done = SpooledProduced::default();
    for (record, message) in records.iter().zip(messages(records, targets, commit, first_seq)) {
        done.taken += 1;
        let (Spooled::Change { op, oid, .. }, Some((topic, key, value, headers, batch))) = (record, message)
        else {
            continue;
        };
        match producer.send_owned(topic, key, value, headers, batch) {
            None => {
                let counts = done.produced.entry(*oid).or_default();
                let slot = match op {
                    b'c' => 0,
                    b'u' => 1,
                    _ => 2,
                };
                counts.0[slot] += 1;
                counts.1 += key.map_or(0, <[u8]>::len) + value.map_or(0, <[u8]>::len);
            }
            Some((size, reason, too_large)) => {
                done.refused.push((*oid, size, reason, too_large));
                if stop_on_refusal {
                    break;
                }
            }
        }
    }
    done
}

/// The records `records` holds from `start` on (an index into a list of `bytes`, or a byte offset
/// into one `bytes` block of length-prefixed records), held so they can be read without the GIL,
/// each with the bytes it takes.
pub(crate) enum Held<'py> {
    Block(Bound<'py, PyBytes>),
    Records(Vec<Bound<'py, PyBytes>>),
}

impl<'py> Held<'py> {
    pub(crate) fn new(records: &Bound<'py, PyAny>, start: usize) -> PyResult<Self> {
        if let Ok(block) = records.cast::<PyBytes>() {
            return Ok(Held::Block(block.clone()));
        }
        let list = records
            .cast::<PyList>()
            .map_err(|_| PyValueError::new_err("spooled records must be a bytes block or a list of bytes"))?;
        let mut held = Vec::new();
        for item in list.iter().skip(start).take(RECORDS_PER_CALL) {
            let record = item
                .cast_into::<PyBytes>()
                .map_err(|_| PyValueError::new_err("every spooled record must be bytes"))?;
            if parse(record.as_bytes()).is_none() {
                break;
            }
            held.push(record);
        }
        Ok(Held::Records(held))
    }

    /// The records taken from `start` on and the position after them (`start` plus the records
    /// taken for a list, plus their bytes for a block).
    pub(crate) fn scan(&self, start: usize, known: impl Fn(u32) -> bool) -> (Vec<Spooled<'_>>, usize) {
        match self {
            Held::Block(block) => {
                let (taken, span) = scan(framed(block.as_bytes(), start), known, RECORDS_PER_CALL);
                (taken, start + span)
            }
            Held::Records(held) => {
                let (taken, _) = scan(held.iter().map(|r| (r.as_bytes(), 1)), known, RECORDS_PER_CALL);
                let next = start + taken.len();
                (taken, next)
            }
        }
    }
}

/// The Python face of `messages` for the tests (`spool_records` records in, the messages the
/// producer would be handed out): `(next, records taken, [(topic, key, value, headers, batch)])`.
#[pyfunction]
#[pyo3(signature = (records, start, *, targets, lsn, xid, commit_ts, first_seq))]
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub fn spooled_messages<'py>(
    py: Python<'py>,
    records: &Bound<'py, PyAny>,
    start: usize,
    targets: HashMap<u32, Target>,
    lsn: Vec<u8>,
    xid: Vec<u8>,
    commit_ts: Vec<u8>,
    first_seq: u64,
) -> PyResult<(usize, usize, Vec<Bound<'py, PyAny>>)> {
    let held = Held::new(records, start)?;
    let (taken, next) = held.scan(start, |oid| targets.contains_key(&oid));
    let commit = CommitHeaders {
        lsn: &lsn,
        xid: &xid,
        commit_ts: &commit_ts,
    };
    let mut out = Vec::new();
    for (topic, key, value, headers, batch) in messages(&taken, &targets, &commit, first_seq).flatten() {
        let pairs: Vec<(String, Vec<u8>)> = headers
            .iter()
            .map(|h| (h.key.to_owned(), h.value.unwrap_or_default().to_vec()))
            .collect();
        let key = key.map(|k| PyBytes::new(py, k));
        let value = value.map(|v| PyBytes::new(py, v));
        out.push((topic, key, value, pairs, batch).into_pyobject(py)?.into_any());
    }
    Ok((next, taken.len(), out))
}

/// What `PyProducer.produce_spooled` returns: the position after the records taken, how many they
/// were, the messages produced as `(relation, inserts, updates, deletes, bytes)`, and the refused
/// ones as `(relation, size, reason, too_large)`.
pub type Outcome = (
    usize,
    usize,
    Vec<(u32, u64, u64, u64, usize)>,
    Vec<(u32, usize, String, bool)>,
);

/// `PyProducer.produce_spooled`'s work: scan under the GIL, produce without it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn produce_from(
    py: Python<'_>,
    producer: &PyProducer,
    records: &Bound<'_, PyAny>,
    start: usize,
    targets: &HashMap<u32, Target>,
    commit: &CommitHeaders<'_>,
    first_seq: u64,
    stop_on_refusal: bool,
) -> PyResult<Outcome> {
    let held = Held::new(records, start)?;
    let (taken, next) = held.scan(start, |oid| targets.contains_key(&oid));
    let done = detached(py, "native producer", "a streamed transaction", || {
        produce(producer, &taken, targets, commit, first_seq, stop_on_refusal)
    })?;
    // Stopped at a refusal: the position after the refused record.
    let after = match &held {
        _ if done.taken == taken.len() => next,
        Held::Records(_) => start + done.taken,
        Held::Block(block) => {
            let sizes = framed(block.as_bytes(), start).take(done.taken);
            start + sizes.map(|(_, size)| size).sum::<usize>()
        }
    };
    let produced = done
        .produced
        .into_iter()
        .map(|(oid, ([c, u, d], size))| (oid, c, u, d, size))
        .collect();
    Ok((after, done.taken, produced, done.refused))
}

#[cfg(test)]
#[path = "spooled_tests.rs"]
mod tests;

//! The native producer: librdkafka (built from source by rdkafka-sys and linked into this
//! extension) driven from Rust, so that a whole batch of rows is encoded and handed to Kafka in one
//! call from Python, with the GIL released, instead of one `produce()` and one delivery callback
//! per message through confluent-kafka.
//!
//! The producer is built from the same settings dict as the confluent-kafka one, so `-C` and the
//! worker's defaults mean the same here. Delivery reports are served by rdkafka's polling thread
//! and only counted there, per batch id (a number the caller picks, e.g. one per table and reader):
//! delivered messages, and failed ones per topic and reason. Python takes the counts in bulk
//! (`take_reports`) where it served confluent-kafka's callbacks before (its poll and flush points).
//!
//! This extension's own symbols are hidden (rustc's version script for a cdylib exports only the
//! module's init function), so its librdkafka does not clash with the one confluent-kafka loads.

use std::collections::HashMap;
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::plan::{Batch, Encoded};
use crate::{detached, held_payloads, spooled, PyPlan};

/// How long to wait for room in librdkafka's queue before trying a message again.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(5);
/// How long each of `flush`'s calls of librdkafka's flush lasts (in milliseconds): librdkafka
/// holds its "flushing" state (linger.ms waived) only during a call.
const FLUSH_STEP_MS: i32 = 1;

#[derive(Default)]
struct Reports {
    delivered: HashMap<usize, u64>,
    /// (batch, topic, reason) -> messages
    failed: HashMap<(usize, String, String), u64>,
}

struct Counting {
    reports: Mutex<Reports>,
}

impl ClientContext for Counting {}

impl ProducerContext for Counting {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, batch: usize) {
        // A poisoned lock only means another thread panicked while counting; the counts stay valid.
        let mut reports = self.reports.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(_) => *reports.delivered.entry(batch).or_default() += 1,
            Err((error, message)) => {
                let key = (batch, message.topic().to_owned(), error_text(error));
                *reports.failed.entry(key).or_default() += 1;
            }
        }
    }
}

/// librdkafka's own description of an error (`rd_kafka_err2str`, what confluent-kafka's
/// `KafkaError.str()` says), without rdkafka's enum name in front of it.
fn error_text(error: &KafkaError) -> String {
    match error.rdkafka_error_code() {
        Some(code) => code_text(code),
        None => error.to_string(),
    }
}

fn code_text(code: RDKafkaErrorCode) -> String {
    // rdkafka writes "Name (description)".
    let shown = code.to_string();
    match shown.split_once(" (") {
        Some((_, rest)) => rest.strip_suffix(')').unwrap_or(rest).to_owned(),
        None => shown,
    }
}

/// A transactional call's failure: (librdkafka's code name, its description, fatal (the producer is
/// unusable: fenced), abortable (the transaction must be aborted), retriable).
type TxnError = (String, String, bool, bool, bool);

fn txn_error(error: KafkaError) -> TxnError {
    match error {
        KafkaError::Transaction(e) => (
            e.name(),
            e.string(),
            e.is_fatal(),
            e.txn_requires_abort(),
            e.is_retriable(),
        ),
        other => {
            let name = other
                .rdkafka_error_code()
                .map_or_else(|| "unknown".to_owned(), |c| format!("{c:?}"));
            (name, error_text(&other), false, false, false)
        }
    }
}

/// A message the producer refused when it was handed over: (index in the call, key + value bytes,
/// reason, whether it is over `message.max.bytes`).
type Refused = (usize, usize, String, bool);

/// One librdkafka producer with delivery reports counted per batch.
#[pyclass(frozen, module = "cdc_worker.core.encoding._native_codec", name = "Producer")]
pub struct PyProducer {
    producer: ThreadedProducer<Counting>,
}

impl PyProducer {
    /// Hands every row of `batch` to librdkafka, waiting while its queue is full.
    fn send_rows(&self, topic: &str, headers: &OwnedHeaders, batch: &Batch, id: usize) -> Vec<Refused> {
        let mut refused = Vec::new();
        for (index, row) in batch.rows.iter().enumerate() {
            if row.skipped {
                continue;
            }
            let key = row.key.map(|(s, e)| &batch.out[s..e]);
            let value = row.value.map(|(s, e)| &batch.out[s..e]);
            if let Some(problem) = self.send_one(topic, key, value, headers, id) {
                refused.push((index, problem.0, problem.1, problem.2));
            }
        }
        refused
    }

    fn send_one(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &OwnedHeaders,
        id: usize,
    ) -> Option<(usize, String, bool)> {
        self.send_owned(topic, key, value, headers.clone(), id)
    }

    /// `send_one` with headers made for this message alone (no copy).
    pub(crate) fn send_owned(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: OwnedHeaders,
        id: usize,
    ) -> Option<(usize, String, bool)> {
        let mut record: BaseRecord<'_, [u8], [u8], usize> = BaseRecord {
            topic,
            partition: None,
            payload: value,
            key,
            timestamp: None,
            headers: Some(headers),
            delivery_opaque: id,
        };
        loop {
            match self.producer.send(record) {
                Ok(()) => return None,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // The polling thread serves delivery reports meanwhile, which makes room.
                    record = back;
                    sleep(QUEUE_FULL_WAIT);
                }
                Err((error, _)) => {
                    let size = key.map_or(0, <[u8]>::len) + value.map_or(0, <[u8]>::len);
                    let too_large = matches!(
                        error.rdkafka_error_code(),
                        Some(RDKafkaErrorCode::MessageSizeTooLarge)
                    );
                    return Some((size, error_text(&error), too_large));
                }
            }
        }
    }
}

/// The `bw.*` headers every event of one transaction shares, and the relation's column names
/// (for `bw.unchanged`).
struct ChangeHeaders<'a> {
    lsn: &'a [u8],
    xid: &'a [u8],
    commit_ts: &'a [u8],
    names: &'a [String],
}

/// What producing a run of changes did: events numbered (each took a `seq`), messages produced
/// per op (`c`, `u`, `d`), their key and value bytes, and the messages librdkafka refused.
#[derive(Default)]
struct ChangesProduced {
    events: usize,
    ops: [u64; 3],
    bytes: usize,
    refused: Vec<Refused>,
}

impl PyProducer {
    /// Every event of `batch` produced in order with its own headers: `bw.op`, `bw.lsn`, `bw.seq`
    /// (from `first_seq`, one per event, the unpublished delete of an unkeyed table included),
    /// `bw.xid`, `bw.commit_ts` and, when columns are left out, `bw.unchanged`, as the reference
    /// serializer writes them. With `stop_on_refusal`, nothing after a refused message is produced.
    fn send_changes(
        &self,
        topic: &str,
        shared: &ChangeHeaders<'_>,
        first_seq: u64,
        batch: &Batch,
        id: usize,
        stop_on_refusal: bool,
    ) -> ChangesProduced {
        let mut done = ChangesProduced::default();
        let mut seq_text = Vec::with_capacity(20);
        let mut unchanged_text = Vec::new();
        for (index, event) in batch.rows.iter().enumerate() {
            let seq = first_seq + index as u64;
            done.events = index + 1;
            if event.skipped {
                continue;
            }
            let headers = change_headers(event, shared, seq, batch, &mut seq_text, &mut unchanged_text);
            let key = event.key.map(|(s, e)| &batch.out[s..e]);
            let value = event.value.map(|(s, e)| &batch.out[s..e]);
            match self.send_owned(topic, key, value, headers, id) {
                None => {
                    let slot = match event.op {
                        b'c' => 0,
                        b'u' => 1,
                        _ => 2,
                    };
                    done.ops[slot] += 1;
                    done.bytes += key.map_or(0, <[u8]>::len) + value.map_or(0, <[u8]>::len);
                }
                Some((size, reason, too_large)) => {
                    done.refused.push((index, size, reason, too_large));
                    if stop_on_refusal {
                        break;
                    }
                }
            }
        }
        done
    }
}

/// One event's `bw.*` headers, its `bw.seq` and `bw.unchanged` texts written into the buffers
/// given (reused from one event to the next).
fn change_headers(
    event: &Encoded,
    shared: &ChangeHeaders<'_>,
    seq: u64,
    batch: &Batch,
    seq_text: &mut Vec<u8>,
    unchanged_text: &mut Vec<u8>,
) -> OwnedHeaders {
    use std::io::Write;
    seq_text.clear();
    // Writing an integer into a Vec cannot fail.
    let _ = write!(seq_text, "{seq}");
    let op: &[u8] = match event.op {
        b'c' => b"c",
        b'u' => b"u",
        _ => b"d",
    };
    let unchanged = &batch.unchanged[event.unchanged.clone()];
    let headers = OwnedHeaders::new_with_capacity(5 + usize::from(!unchanged.is_empty()))
        .insert(Header {
            key: "bw.op",
            value: Some(op),
        })
        .insert(Header {
            key: "bw.lsn",
            value: Some(shared.lsn),
        })
        .insert(Header {
            key: "bw.seq",
            value: Some(seq_text.as_slice()),
        })
        .insert(Header {
            key: "bw.xid",
            value: Some(shared.xid),
        })
        .insert(Header {
            key: "bw.commit_ts",
            value: Some(shared.commit_ts),
        });
    if unchanged.is_empty() {
        return headers;
    }
    unchanged_text.clear();
    for (n, &column) in unchanged.iter().enumerate() {
        if n > 0 {
            unchanged_text.push(b',');
        }
        unchanged_text.extend_from_slice(shared.names[usize::from(column)].as_bytes());
    }
    headers.insert(Header {
        key: "bw.unchanged",
        value: Some(unchanged_text.as_slice()),
    })
}

fn owned_headers(headers: &[(String, Vec<u8>)]) -> OwnedHeaders {
    headers.iter().fold(
        OwnedHeaders::new_with_capacity(headers.len()),
        |all, (key, value)| {
            all.insert(Header {
                key,
                value: Some(value),
            })
        },
    )
}

#[pymethods]
impl PyProducer {
    /// `settings`: the librdkafka settings, exactly those given to confluent-kafka's Producer.
    /// Raises ValueError with librdkafka's reason when it refuses one (or this build lacks it).
    #[new]
    fn new(settings: Vec<(String, String)>) -> PyResult<Self> {
        let mut config = ClientConfig::new();
        for (key, value) in settings {
            config.set(key, value);
        }
        let context = Counting {
            reports: Mutex::new(Reports::default()),
        };
        let producer = config
            .create_with_context(context)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(PyProducer { producer })
    }

    /// Encodes the COPY TEXT rows of `data[start:]` with `plan` and produces each to `topic` with
    /// `headers`, counting their delivery under `batch`, all without the GIL. Returns `(rows,
    /// stop, refused)`: how many rows were encoded (and produced, but for `refused`), the plan's
    /// stop (as `Plan.encode_copy`'s: the first line it declined, produced by nobody yet), and the
    /// messages librdkafka refused as `(index, size, reason, too_large)`.
    #[pyo3(signature = (plan, data, start, *, topic, headers, batch))]
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn produce_copy(
        &self,
        py: Python<'_>,
        plan: &Bound<'_, PyPlan>,
        data: &Bound<'_, PyBytes>,
        start: usize,
        topic: &str,
        headers: Vec<(String, Vec<u8>)>,
        batch: usize,
    ) -> PyResult<(usize, Option<(usize, usize, usize, usize, String)>, Vec<Refused>)> {
        let plan = &plan.get().plan;
        let buf = data.as_bytes();
        let headers = owned_headers(&headers);
        detached(py, "native producer", &plan.relation, || {
            let encoded = plan.encode_copy(buf, start);
            let refused = self.send_rows(topic, &headers, &encoded, batch);
            let stop = encoded
                .stop
                .map(|s| (s.index, s.line_start, s.line_end, s.next, s.reason));
            (encoded.rows.len(), stop, refused)
        })
    }

    /// Encodes the pgoutput Insert/Update/Delete payloads `payloads[start:]` of one transaction
    /// with `plan` (as `Plan.encode_changes`) and produces each event to `topic` with its `bw.*`
    /// headers (`lsn`, `xid`, `commit_ts`: the transaction's header values; `bw.seq` counts from
    /// `first_seq`), counting their delivery under `batch`, all without the GIL. Returns `(events,
    /// stop, (inserts, updates, deletes), bytes, refused)`: how many events were numbered, the
    /// plan's stop (`(index, reason)` of the first payload declined, produced by nobody yet), the
    /// messages produced per op and their key and value bytes, and the messages librdkafka refused
    /// as `(event index, size, reason, too_large)`. With `stop_on_refusal`, producing ends at the
    /// first refusal (`events` then counts up to it).
    #[pyo3(signature = (plan, payloads, start, *, topic, lsn, xid, commit_ts, first_seq, batch, stop_on_refusal))]
    #[allow(clippy::type_complexity, clippy::too_many_arguments)]
    fn produce_changes(
        &self,
        py: Python<'_>,
        plan: &Bound<'_, PyPlan>,
        payloads: &Bound<'_, PyList>,
        start: usize,
        topic: &str,
        lsn: Vec<u8>,
        xid: Vec<u8>,
        commit_ts: Vec<u8>,
        first_seq: u64,
        batch: usize,
        stop_on_refusal: bool,
    ) -> PyResult<(
        usize,
        Option<(usize, String)>,
        (u64, u64, u64),
        usize,
        Vec<Refused>,
    )> {
        let plan = &plan.get().plan;
        let held = held_payloads(payloads, start)?;
        let slices: Vec<&[u8]> = held.iter().map(|b| b.as_bytes()).collect();
        let shared = ChangeHeaders {
            lsn: &lsn,
            xid: &xid,
            commit_ts: &commit_ts,
            names: &plan.names,
        };
        let (done, stop) = detached(py, "native producer", &plan.relation, || {
            let encoded = plan.encode_changes(&slices, false);
            let done = self.send_changes(topic, &shared, first_seq, &encoded, batch, stop_on_refusal);
            let stop = if done.refused.is_empty() || !stop_on_refusal {
                encoded.stop.map(|s| (s.index + start, s.reason))
            } else {
                None
            };
            (done, stop)
        })?;
        let [inserts, updates, deletes] = done.ops;
        Ok((
            done.events,
            stop,
            (inserts, updates, deletes),
            done.bytes,
            done.refused,
        ))
    }

    /// The change and skip records of a committed streamed transaction's spool (`records`: a list
    /// of `bytes` from index `start`, or a `bytes` block of length-prefixed records from byte
    /// `start`) produced in order with the commit's `bw.*` headers (`bw.seq` from `first_seq`, one
    /// per record), each to its relation's `(topic, batch)` in `targets`, without the GIL (see
    /// `spooled.rs`). Stops before the first record it does not take and, with `stop_on_refusal`,
    /// after a refused message. Returns `(next, records taken, produced, refused)`: the position
    /// after the records taken, `produced` as `(relation, inserts, updates, deletes, bytes)`,
    /// `refused` as `(relation, size, reason, too_large)`.
    #[pyo3(signature = (records, start, *, targets, lsn, xid, commit_ts, first_seq, stop_on_refusal))]
    #[allow(clippy::too_many_arguments)]
    fn produce_spooled(
        &self,
        py: Python<'_>,
        records: &Bound<'_, PyAny>,
        start: usize,
        targets: HashMap<u32, spooled::Target>,
        lsn: Vec<u8>,
        xid: Vec<u8>,
        commit_ts: Vec<u8>,
        first_seq: u64,
        stop_on_refusal: bool,
    ) -> PyResult<spooled::Outcome> {
        let commit = spooled::CommitHeaders {
            lsn: &lsn,
            xid: &xid,
            commit_ts: &commit_ts,
        };
        spooled::produce_from(
            py,
            self,
            records,
            start,
            &targets,
            &commit,
            first_seq,
            stop_on_refusal,
        )
    }

    /// One message encoded elsewhere (a row the plan declined, done by the Python reference).
    /// Returns None, or `(size, reason, too_large)` when librdkafka refuses it.
    #[pyo3(signature = (topic, key, value, headers, batch))]
    fn produce(
        &self,
        py: Python<'_>,
        topic: &str,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<(String, Vec<u8>)>,
        batch: usize,
    ) -> Option<(usize, String, bool)> {
        let headers = owned_headers(&headers);
        py.detach(|| self.send_one(topic, key.as_deref(), value.as_deref(), &headers, batch))
    }

    /// Delivery reports counted since the last call: `(delivered, failed)`, `delivered` a list of
    /// `(batch, messages)`, `failed` a list of `(batch, topic, reason, messages)`.
    #[allow(clippy::type_complexity)]
    fn take_reports(&self) -> (Vec<(usize, u64)>, Vec<(usize, String, String, u64)>) {
        let mut reports = self
            .producer
            .context()
            .reports
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let delivered = reports.delivered.drain().collect();
        let failed = reports
            .failed
            .drain()
            .map(|((b, t, r), n)| (b, t, r, n))
            .collect();
        (delivered, failed)
    }

    /// The transactional calls of a producer built with `transactional.id` (librdkafka's
    /// `rd_kafka_*_transaction`), without the GIL: None, or the failure as `TxnError`.
    fn init_transactions(&self, py: Python<'_>, timeout: f64) -> Option<TxnError> {
        py.detach(|| {
            self.producer
                .init_transactions(Duration::from_secs_f64(timeout.max(0.0)))
        })
        .err()
        .map(txn_error)
    }

    fn begin_transaction(&self) -> Option<TxnError> {
        self.producer.begin_transaction().err().map(txn_error)
    }

    fn commit_transaction(&self, py: Python<'_>, timeout: f64) -> Option<TxnError> {
        py.detach(|| {
            self.producer
                .commit_transaction(Duration::from_secs_f64(timeout.max(0.0)))
        })
        .err()
        .map(txn_error)
    }

    fn abort_transaction(&self, py: Python<'_>, timeout: f64) -> Option<TxnError> {
        py.detach(|| {
            self.producer
                .abort_transaction(Duration::from_secs_f64(timeout.max(0.0)))
        })
        .err()
        .map(txn_error)
    }

    /// Records `offset` as group `group_id`'s committed offset of `topic` partition `partition`
    /// inside the open transaction (`rd_kafka_send_offsets_to_transaction`), so that it is committed
    /// or aborted with it: the stream keeps there the position each Kafka transaction made visible.
    /// None, or the failure as `TxnError`.
    fn send_position(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        group_id: &str,
        timeout: f64,
    ) -> Option<TxnError> {
        use rdkafka::bindings as rd;
        use std::ffi::{CStr, CString};
        let mut list = TopicPartitionList::new();
        if let Err(e) = list.add_partition_offset(topic, partition, Offset::Offset(offset)) {
            return Some(txn_error(e));
        }
        let group = match CString::new(group_id) {
            Ok(g) => g,
            Err(_) => {
                return Some((
                    "_INVALID_ARG".to_owned(),
                    "a NUL in the group id".to_owned(),
                    false,
                    false,
                    false,
                ))
            }
        };
        let millis = (timeout.max(0.0) * 1000.0) as i32;
        // SAFETY: every pointer is valid for the calls (the producer, the list and the group id
        // outlive them), and the metadata and the error are destroyed once read.
        unsafe {
            let metadata = rd::rd_kafka_consumer_group_metadata_new(group.as_ptr());
            let error = rd::rd_kafka_send_offsets_to_transaction(
                self.producer.client().native_ptr(),
                list.ptr(),
                metadata,
                millis,
            );
            rd::rd_kafka_consumer_group_metadata_destroy(metadata);
            if error.is_null() {
                return None;
            }
            let text = |p: *const std::os::raw::c_char| CStr::from_ptr(p).to_string_lossy().into_owned();
            let failure = (
                text(rd::rd_kafka_error_name(error)),
                text(rd::rd_kafka_error_string(error)),
                rd::rd_kafka_error_is_fatal(error) != 0,
                rd::rd_kafka_error_txn_requires_abort(error) != 0,
                rd::rd_kafka_error_is_retriable(error) != 0,
            );
            rd::rd_kafka_error_destroy(error);
            Some(failure)
        }
    }

    /// Messages handed over whose delivery report has not been counted yet.
    fn in_flight(&self) -> i32 {
        self.producer.in_flight_count()
    }

    /// Waits up to `timeout` seconds (without the GIL) for every delivery report; returns how many
    /// messages are still in flight.
    ///
    /// Not rdkafka's `flush`: it polls the main queue in steps of 100 ms, whose events the
    /// producer's own thread takes first, so each flush with anything in flight took 100 ms (under
    /// `--delivery exactly-once`, every Kafka commit). Here librdkafka's flush is called for a
    /// millisecond at a time until nothing is in flight: each call wakes the brokers' threads and
    /// holds librdkafka's flushing state, which sends what waits for `linger.ms` at once. (A call
    /// that returned at once left that state before the brokers' threads woke, so the messages of
    /// a commit often waited out `linger.ms`: visible p50 19.8 ms at 1,000 tx/s, now 6.9 ms.)
    fn flush(&self, py: Python<'_>, timeout: f64) -> i32 {
        py.detach(|| {
            let deadline = Instant::now() + Duration::from_secs_f64(timeout.max(0.0));
            loop {
                let left = self.producer.in_flight_count();
                if left == 0 || Instant::now() >= deadline {
                    return left;
                }
                // SAFETY: the producer's handle is valid while `self` is.
                unsafe {
                    rdkafka::bindings::rd_kafka_flush(self.producer.client().native_ptr(), FLUSH_STEP_MS)
                };
            }
        })
    }
}

/// librdkafka's version, e.g. "2.12.1".
pub fn librdkafka_version() -> String {
    rdkafka::util::get_rdkafka_version().1
}

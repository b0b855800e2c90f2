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
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use crate::plan::Batch;
use crate::{NativeCodecError, PyPlan};

/// How long to wait for room in librdkafka's queue before trying a message again.
const QUEUE_FULL_WAIT: Duration = Duration::from_millis(5);

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
        let mut record: BaseRecord<'_, [u8], [u8], usize> = BaseRecord {
            topic,
            partition: None,
            payload: value,
            key,
            timestamp: None,
            headers: Some(headers.clone()),
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
        let relation = plan.relation.clone();
        let outcome = py.detach(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let encoded = plan.encode_copy(buf, start);
                let refused = self.send_rows(topic, &headers, &encoded, batch);
                let stop = encoded
                    .stop
                    .map(|s| (s.index, s.line_start, s.line_end, s.next, s.reason));
                (encoded.rows.len(), stop, refused)
            }))
        });
        outcome.map_err(|_| {
            NativeCodecError::new_err(format!("native producer panicked on relation {relation}"))
        })
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

    /// Messages handed over whose delivery report has not been counted yet.
    fn in_flight(&self) -> i32 {
        self.producer.in_flight_count()
    }

    /// Waits up to `timeout` seconds (without the GIL) for every delivery report; returns how many
    /// messages are still in flight.
    fn flush(&self, py: Python<'_>, timeout: f64) -> i32 {
        py.detach(|| {
            let _ = self.producer.flush(Duration::from_secs_f64(timeout.max(0.0)));
            self.producer.in_flight_count()
        })
    }
}

/// librdkafka's version, e.g. "2.12.1".
pub fn librdkafka_version() -> String {
    rdkafka::util::get_rdkafka_version().1
}

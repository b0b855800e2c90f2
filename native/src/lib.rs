//! Bottled Water's native row codec, `cdc_worker.core.encoding._native_codec`.
//!
//! Per relation version the Python glue (`cdc_worker/core/encoding/native.py`) compiles a `Plan`
//! (a kind per column, the key, Avro with its Confluent framing or JSON), then hands it whole
//! batches: COPY TEXT buffers (snapshot) or lists of pgoutput Insert/Update/Delete payloads
//! (stream). A batch is encoded into one Rust buffer with the GIL released, then turned into
//! `bytes` objects, one per key and value.
//!
//! The native path accepts only the canonical text Postgres writes and stops at the first row or
//! message it declines (bad bytes, a value the Python reference refuses or treats specially),
//! reporting its index, position and reason: the glue runs that one item through the Python
//! reference, which raises its exact error or encodes it, and goes on natively after it. Nothing
//! here panics on any input; every entry point also catches panics, so none crosses into Python.

use std::panic::{catch_unwind, AssertUnwindSafe};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString, PyTuple};

pub mod avro;
pub mod copy_text;
pub mod numbers;
pub mod pgoutput;
pub mod plan;
pub mod producer;
pub mod spool_records;
pub mod spooled;
pub mod temporal;
pub mod text;

use plan::{Batch, Kind, Plan};

/// The native path declines a value, row or message (the reason is for error messages only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decline(pub &'static str);

/// A column value of a row being encoded: NULL, pgoutput's unchanged-TOAST marker, or text at a
/// byte range of the input buffer or of the unescaping scratch buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cell {
    Null,
    Toast,
    Input(usize, usize),
    Scratch(usize, usize),
}

/// Batches above this many input bytes are encoded with the GIL released.
const DETACH_BYTES: usize = 32 * 1024;

pyo3::create_exception!(
    _native_codec,
    NativeCodecError,
    PyRuntimeError,
    "The native codec failed internally (a bug: the glue falls back to the Python reference)."
);

fn guarded<T>(relation: &str, work: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => result,
        Err(panic) => {
            let detail = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(NativeCodecError::new_err(format!(
                "native codec panicked on relation {relation}: {detail}"
            )))
        }
    }
}

/// `work` with the GIL released; a panic in it is raised as `NativeCodecError` ("`what` panicked
/// on relation ..."), never crossing into Python.
pub(crate) fn detached<T: Send>(
    py: Python<'_>,
    what: &str,
    relation: &str,
    work: impl FnOnce() -> T + Send,
) -> PyResult<T> {
    py.detach(|| catch_unwind(AssertUnwindSafe(work)))
        .map_err(|_| NativeCodecError::new_err(format!("{what} panicked on relation {relation}")))
}

/// The payloads `payloads[start:]`, each a `bytes` object, held so that their bytes can be read
/// without the GIL.
pub(crate) fn held_payloads<'py>(
    payloads: &Bound<'py, PyList>,
    start: usize,
) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    let mut held = Vec::with_capacity(payloads.len().saturating_sub(start));
    for item in payloads.iter().skip(start) {
        held.push(
            item.cast_into::<PyBytes>()
                .map_err(|_| PyValueError::new_err("every payload must be bytes"))?,
        );
    }
    Ok(held)
}

/// One relation version's compiled plan.
#[pyclass(frozen, module = "cdc_worker.core.encoding._native_codec", name = "Plan")]
pub struct PyPlan {
    pub(crate) plan: Plan,
    names: Vec<Py<PyString>>,
    /// The `Op` members for `c`, `u`, `d`, in that order (put into the event tuples as they are).
    ops: [Py<PyAny>; 3],
}

#[pymethods]
impl PyPlan {
    /// `columns`: per column (name, kind spec, `encode_basestring(name)` as bytes, whether it is
    /// in the replica identity). `output_format`: "avro" or "json". Prefixes: the Confluent
    /// framing of key and value (Avro). `ops`: the Op members for insert, update, delete.
    #[new]
    #[pyo3(signature = (relation, relation_oid, columns, key_indexes, output_format, key_prefix, value_prefix, ops))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        relation: String,
        relation_oid: u32,
        columns: Vec<(String, String, Vec<u8>, bool)>,
        key_indexes: Vec<usize>,
        output_format: &str,
        key_prefix: Vec<u8>,
        value_prefix: Vec<u8>,
        ops: (Py<PyAny>, Py<PyAny>, Py<PyAny>),
    ) -> PyResult<Self> {
        let avro = match output_format {
            "avro" => true,
            "json" => false,
            other => {
                return Err(PyValueError::new_err(format!(
                    "output format {other:?} is neither avro nor json"
                )))
            }
        };
        let mut kinds = Vec::with_capacity(columns.len());
        for (name, spec, _, _) in &columns {
            kinds.push(
                Kind::parse(spec)
                    .map_err(|e| PyValueError::new_err(format!("column {name} of {relation}: {e}")))?,
            );
        }
        if let Some(&bad) = key_indexes.iter().find(|&&i| i >= columns.len()) {
            return Err(PyValueError::new_err(format!(
                "key index {bad} out of range for {relation}"
            )));
        }
        if columns.len() > usize::from(u16::MAX) {
            return Err(PyValueError::new_err("too many columns"));
        }
        let identity: Vec<bool> = columns.iter().map(|c| c.3).collect();
        let key_in_identity = key_indexes.iter().all(|&i| identity[i]);
        let names: Vec<Py<PyString>> = columns.iter().map(|c| PyString::new(py, &c.0).unbind()).collect();
        Ok(PyPlan {
            plan: Plan {
                relation,
                relation_oid,
                names: columns.iter().map(|c| c.0.clone()).collect(),
                json_names: columns.iter().map(|c| c.2.clone()).collect(),
                kinds,
                key_indexes,
                identity,
                key_in_identity,
                avro,
                key_prefix,
                value_prefix,
            },
            names,
            ops: [ops.0, ops.1, ops.2],
        })
    }

    /// COPY TEXT rows of `data[start:]` -> `(rows, stop)`: `rows` a list of `(key, value)`
    /// (key None when unkeyed); `stop` None, or `(index, line_start, line_end, next, reason)` of
    /// the first line declined (its bytes are `data[line_start:line_end]`; resume at `next`).
    #[pyo3(signature = (data, start=0))]
    fn encode_copy<'py>(
        &self,
        py: Python<'py>,
        data: &Bound<'py, PyBytes>,
        start: usize,
    ) -> PyResult<(Bound<'py, PyList>, Py<PyAny>)> {
        guarded(&self.plan.relation, || {
            let buf = data.as_bytes();
            let plan = &self.plan;
            let batch = if buf.len().saturating_sub(start) > DETACH_BYTES {
                detached(py, "native codec", &plan.relation, || {
                    plan.encode_copy(buf, start)
                })?
            } else {
                plan.encode_copy(buf, start)
            };
            let rows = PyList::empty(py);
            for row in &batch.rows {
                let key = span_bytes(py, &batch, row.key);
                let value = span_bytes(py, &batch, row.value);
                rows.append(PyTuple::new(py, [key, value])?)?;
            }
            let stop = match &batch.stop {
                None => py.None(),
                Some(stop) => (
                    stop.index,
                    stop.line_start,
                    stop.line_end,
                    stop.next,
                    stop.reason.as_str(),
                )
                    .into_pyobject(py)?
                    .into_any()
                    .unbind(),
            };
            Ok((rows, stop))
        })
    }

    /// pgoutput Insert/Update/Delete payloads `payloads[start:]` -> `(events, stop)`: `events` a
    /// list of `(op, key, value, unchanged)` tuples, or None for an event that takes a `seq` but
    /// is not published (the delete of an unkeyed table); `stop` None, or `(index, reason)` of the
    /// first payload declined (index into `payloads`).
    #[pyo3(signature = (payloads, start=0, in_stream=false))]
    fn encode_changes<'py>(
        &self,
        py: Python<'py>,
        payloads: &Bound<'py, PyList>,
        start: usize,
        in_stream: bool,
    ) -> PyResult<(Bound<'py, PyList>, Py<PyAny>)> {
        guarded(&self.plan.relation, || {
            let held = held_payloads(payloads, start)?;
            let slices: Vec<&[u8]> = held.iter().map(|b| b.as_bytes()).collect();
            let total: usize = slices.iter().map(|s| s.len()).sum();
            let plan = &self.plan;
            let batch = if total > DETACH_BYTES {
                detached(py, "native codec", &plan.relation, || {
                    plan.encode_changes(&slices, in_stream)
                })?
            } else {
                plan.encode_changes(&slices, in_stream)
            };
            let events = PyList::empty(py);
            let no_names = PyTuple::empty(py);
            for event in &batch.rows {
                if event.skipped {
                    events.append(py.None())?;
                    continue;
                }
                let op = match event.op {
                    b'c' => &self.ops[0],
                    b'u' => &self.ops[1],
                    _ => &self.ops[2],
                };
                let unchanged = if event.unchanged.is_empty() {
                    no_names.clone()
                } else {
                    PyTuple::new(
                        py,
                        batch.unchanged[event.unchanged.clone()]
                            .iter()
                            .map(|&i| self.names[usize::from(i)].clone_ref(py)),
                    )?
                };
                let tuple = PyTuple::new(
                    py,
                    [
                        op.clone_ref(py).into_bound(py),
                        span_bytes(py, &batch, event.key),
                        span_bytes(py, &batch, event.value),
                        unchanged.into_any(),
                    ],
                )?;
                events.append(tuple)?;
            }
            let stop = match &batch.stop {
                None => py.None(),
                Some(stop) => (stop.index + start, stop.reason.as_str())
                    .into_pyobject(py)?
                    .into_any()
                    .unbind(),
            };
            Ok((events, stop))
        })
    }

    /// pgoutput Insert/Update/Delete payloads `payloads[start:]` of a streamed transaction ->
    /// `(records, stop)`: each event as the spool's record (`spool_records.rs`), and `stop` as
    /// `encode_changes`'s (the payloads from it on are the caller's).
    #[pyo3(signature = (payloads, start=0))]
    fn encode_spool_records<'py>(
        &self,
        py: Python<'py>,
        payloads: &Bound<'py, PyList>,
        start: usize,
    ) -> PyResult<(Bound<'py, PyList>, Py<PyAny>)> {
        guarded(&self.plan.relation, || {
            let held = held_payloads(payloads, start)?;
            let slices: Vec<&[u8]> = held.iter().map(|b| b.as_bytes()).collect();
            let plan = &self.plan;
            let work = || {
                let batch = plan.encode_changes(&slices, true);
                (spool_records::write(plan, &batch), batch.stop)
            };
            let total: usize = slices.iter().map(|s| s.len()).sum();
            let ((out, ranges), stop) = if total > DETACH_BYTES {
                detached(py, "native codec", &plan.relation, work)?
            } else {
                work()
            };
            let records = PyList::new(py, ranges.into_iter().map(|r| PyBytes::new(py, &out[r])))?;
            let stop = match stop {
                None => py.None(),
                Some(stop) => (stop.index + start, stop.reason.as_str())
                    .into_pyobject(py)?
                    .into_any()
                    .unbind(),
            };
            Ok((records, stop))
        })
    }

    #[getter]
    fn relation(&self) -> &str {
        &self.plan.relation
    }
}

fn span_bytes<'py>(py: Python<'py>, batch: &Batch, span: plan::Span) -> Bound<'py, PyAny> {
    match span {
        None => py.None().into_bound(py),
        Some((start, end)) => PyBytes::new(py, &batch.out[start..end]).into_any(),
    }
}

#[pymodule]
fn _native_codec(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PyPlan>()?;
    m.add_class::<producer::PyProducer>()?;
    m.add_function(wrap_pyfunction!(spooled::spooled_messages, m)?)?;
    m.add("librdkafka_version", producer::librdkafka_version())?;
    m.add("NativeCodecError", m.py().get_type::<NativeCodecError>())?;
    Ok(())
}

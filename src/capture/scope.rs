//! Scopes: names for the tensors a block of model code creates. A scope is entered either
//! explicitly (`scope("block.3.attn", || ...)`) or through a `tracing` span (candle-transformers'
//! `with_tracing` layers enter spans named "linear", "attn", "mlp", ...), and remembers which
//! tensor ids were created while it was open. candle numbers tensors from one process-wide
//! counter, so the tensors created inside a scope are exactly the ids between its entry and its
//! exit, and nested scopes nest as intervals.
//!
//! The log is per thread: model code that creates tensors on one thread (as candle training
//! loops do) gets exact intervals.

use candle_core::{DType, Device, Tensor};
use std::cell::RefCell;
use std::collections::BTreeMap;

/// The id the next tensor created will get (candle's counter is private; a zero-sized tensor
/// costs one small allocation and reads it).
pub(crate) fn next_tensor_id() -> u64 {
    let probe = Tensor::zeros(0, DType::U8, &Device::Cpu).expect("a zero-sized CPU tensor");
    tensor_number(&probe)
}

/// A tensor's number in candle's counter, from `TensorId`'s `Debug` form `TensorId(N)`,
/// formatted on the stack: this runs for every node of every captured graph.
pub(crate) fn tensor_number(t: &Tensor) -> u64 {
    use std::io::Write;
    let mut text = [0u8; 48];
    let mut cursor = std::io::Cursor::new(&mut text[..]);
    if write!(cursor, "{:?}", t.id()).is_err() {
        return u64::MAX;
    }
    let len = cursor.position() as usize;
    let digits = text[..len].iter().filter(|b| b.is_ascii_digit());
    digits.fold(0u64, |n, b| n.wrapping_mul(10).wrapping_add(u64::from(b - b'0')))
}

/// One scope instance: its path, and the tensor ids created while it was open.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ScopeSpan {
    /// Each level's name and ordinal among same-named siblings (0-based).
    pub path: Vec<(String, usize)>,
    /// First tensor id created inside.
    pub start: u64,
    /// One past the last (`u64::MAX` while still open).
    pub end: u64,
    /// Where in the source it was opened (`FILE:LINE`), when known.
    pub source: Option<String>,
}

#[derive(Default)]
struct Frame {
    name: String,
    ordinal: usize,
    start: u64,
    source: Option<String>,
    /// How many children of each name were entered so far.
    children: BTreeMap<String, usize>,
}

#[derive(Default)]
struct ScopeLog {
    /// Open scopes, outermost first; the root frame (empty name) is implicit.
    open: Vec<Frame>,
    /// Children of the root entered so far.
    top_children: BTreeMap<String, usize>,
    /// Closed scopes, in closing order.
    closed: Vec<ScopeSpan>,
}

thread_local! {
    static LOG: RefCell<ScopeLog> = RefCell::new(ScopeLog::default());
}

/// Opens a scope named `name` inside the innermost open one, opened at `source` (`FILE:LINE`).
pub(crate) fn enter(name: &str, source: Option<String>) {
    let start = next_tensor_id();
    LOG.with(|log| {
        let mut log = log.borrow_mut();
        let siblings = match log.open.last_mut() {
            Some(parent) => &mut parent.children,
            None => &mut log.top_children,
        };
        let counter = siblings.entry(name.to_string()).or_insert(0);
        let ordinal = *counter;
        *counter += 1;
        log.open.push(Frame { name: name.to_string(), ordinal, start, source, children: BTreeMap::new() });
    });
}

/// Closes the innermost open scope (which must be `name`; a mismatched exit is ignored).
pub(crate) fn exit(name: &str) {
    let end = next_tensor_id();
    LOG.with(|log| {
        let mut log = log.borrow_mut();
        if log.open.last().is_none_or(|f| f.name != name) {
            return;
        }
        let path = path_of(&log.open);
        let frame = log.open.pop().expect("checked above");
        log.closed.push(ScopeSpan { path, start: frame.start, end, source: frame.source });
    });
}

fn path_of(open: &[Frame]) -> Vec<(String, usize)> {
    open.iter().map(|f| (f.name.clone(), f.ordinal)).collect()
}

/// Every scope of the step so far (closed ones, then those still open) and starts a new step:
/// ordinals count from zero again, and open scopes stay open.
pub(crate) fn take_step() -> Vec<ScopeSpan> {
    LOG.with(|log| {
        let mut log = log.borrow_mut();
        let mut spans = std::mem::take(&mut log.closed);
        for depth in 0..log.open.len() {
            let path = path_of(&log.open[..=depth]);
            let (start, source) = (log.open[depth].start, log.open[depth].source.clone());
            spans.push(ScopeSpan { path, start, end: u64::MAX, source });
        }
        log.top_children.clear();
        for frame in &mut log.open {
            frame.children.clear();
        }
        spans
    })
}

/// Runs `f` inside a scope named `name`: graph nodes it creates are named after the scope
/// (`block.3.attn#0`, `block.3.attn#1`, ...), nested inside any scope already open, and carry
/// the file and line of this call (the trace's `source`), so a node points at your code.
#[track_caller]
pub fn scope<R>(name: &str, f: impl FnOnce() -> R) -> R {
    let caller = std::panic::Location::caller();
    enter(name, Some(format!("{}:{}", caller.file(), caller.line())));
    let result = f();
    exit(name);
    result
}

/// A `tracing` layer that opens a scope for every span a model enters, so models instrumented
/// with `tracing` (as candle-transformers' are) name their graph nodes with no change:
///
/// ```
/// use tracing_subscriber::layer::SubscriberExt;
/// let subscriber = tracing_subscriber::registry().with(repro::capture::SpanScopes);
/// let _guard = tracing::subscriber::set_default(subscriber);
/// ```
///
/// `repro::capture::install_span_scopes()` does this for the whole process when no subscriber
/// is set yet.
#[derive(Debug, Clone, Copy, Default)]
pub struct SpanScopes;

impl<S> tracing_subscriber::Layer<S> for SpanScopes
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_enter(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let meta = span.metadata();
            let source = meta.file().map(|file| format!("{file}:{}", meta.line().unwrap_or(0)));
            enter(span.name(), source);
        }
    }

    fn on_exit(&self, id: &tracing::span::Id, ctx: tracing_subscriber::layer::Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            exit(span.name());
        }
    }
}

/// Makes `SpanScopes` this thread's `tracing` subscriber until the returned guard is dropped:
/// graph nodes made meanwhile are named after the spans they were made in.
pub fn span_scopes_on_this_thread() -> tracing::subscriber::DefaultGuard {
    use tracing_subscriber::layer::SubscriberExt;
    tracing::subscriber::set_default(tracing_subscriber::registry().with(SpanScopes))
}

/// Makes `SpanScopes` the process's `tracing` subscriber, unless one is set already (then add
/// the layer to yours). Returns whether it was installed.
pub fn install_span_scopes() -> bool {
    use tracing_subscriber::layer::SubscriberExt;
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(SpanScopes)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn make() -> Tensor {
        Tensor::zeros(1, DType::F32, &Device::Cpu).unwrap()
    }

    #[test]
    fn scopes_cover_the_tensors_created_inside_them() {
        take_step();
        let before = make();
        let (a, b) = scope("block", || (scope("attn", make), scope("attn", make)));
        let line = line!() - 1;
        let spans = take_step();
        assert_eq!(spans[0].source, Some(format!("{}:{line}", file!())), "the caller's line");
        let paths: Vec<_> = spans.iter().map(|s| s.path.clone()).collect();
        let attn = |i| vec![("block".to_string(), 0), ("attn".to_string(), i)];
        assert_eq!(paths, vec![attn(0), attn(1), vec![("block".to_string(), 0)]]);
        let inside = |t: &Tensor, s: &ScopeSpan| (s.start..s.end).contains(&tensor_number(t));
        assert!(inside(&a, &spans[0]) && !inside(&b, &spans[0]));
        assert!(inside(&b, &spans[1]) && inside(&b, &spans[2]));
        assert!(!inside(&before, &spans[2]));
        // A new step counts ordinals from zero again.
        scope("block", make);
        assert_eq!(take_step()[0].path, vec![("block".to_string(), 0)]);
    }

    #[test]
    fn tracing_spans_open_scopes() {
        let _guard = span_scopes_on_this_thread();
        take_step();
        let t = {
            let span = tracing::span!(tracing::Level::TRACE, "mlp");
            let _entered = span.enter();
            make()
        };
        let spans = take_step();
        assert_eq!(spans.len(), 1);
        assert_eq!(spans[0].path, vec![("mlp".to_string(), 0)]);
        assert!((spans[0].start..spans[0].end).contains(&tensor_number(&t)));
    }
}

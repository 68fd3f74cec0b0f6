//! `ModelCapture` records a model's parameters, forward graph, gradients and updated parameters
//! into a `StepRecorder`; `ModelRecorder` bundles it with a `Recorder` so that a training loop
//! records itself in four lines.

use super::graph::{graph_nodes, views, GraphNode};
use super::scope::{take_step, tensor_number, ScopeSpan};
use crate::record::profile;
use crate::record::{Described, RecordError, RecordOptions, Recorder, StepRecorder};
use crate::trace::{Phase, RunConfig, TensorKind};
use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor, Var};
use candle_nn::VarMap;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

/// The named parameters of a model, and how to record them and the graph they feed.
#[derive(Clone)]
pub struct ModelCapture {
    /// Parameters sorted by name (shared with the recorder's worker thread, which reads them).
    params: Arc<[(String, Var)]>,
    /// Tensor number of each parameter, to name graph leaves (shared with the recorder's worker
    /// thread, which names the graph).
    by_id: Arc<BTreeMap<u64, String>>,
}

impl ModelCapture {
    /// The parameters of `varmap`, sorted by name.
    pub fn new(varmap: &VarMap) -> Self {
        let data = varmap.data().lock().expect("VarMap lock");
        Self::from_vars(data.iter().map(|(name, var)| (name.clone(), var.clone())))
    }

    /// Parameters given by name (from any source; sorted here). A new capture is a new run:
    /// scope ordinals count from zero again, whatever ran on this thread before (another run's
    /// training or evaluation).
    pub fn from_vars(vars: impl IntoIterator<Item = (String, Var)>) -> Self {
        take_step();
        let mut params: Vec<(String, Var)> = vars.into_iter().collect();
        params.sort_by(|a, b| a.0.cmp(&b.0));
        let by_id = Arc::new(params.iter().map(|(name, var)| (tensor_number(var.as_tensor()), name.clone())).collect());
        ModelCapture { params: params.into(), by_id }
    }

    /// The parameters, sorted by name.
    pub fn parameters(&self) -> &[(String, Var)] {
        &self.params
    }

    /// The parameters the graph behind `root` reaches, by name (sorted). At inference, the others
    /// are cut off by an op without a backward pass, or unused.
    pub fn reached(&self, root: &Tensor) -> Vec<String> {
        let mut names: Vec<String> =
            root.sorted_nodes().iter().filter_map(|t| self.by_id.get(&tensor_number(t)).cloned()).collect();
        names.sort();
        names
    }

    /// Records every parameter under its name (kind `weight`), as it is before the update. They are
    /// queued on the recorder's worker thread while this thread goes on (the forward pass) and read
    /// when the step next waits for that work, so none may change before it: `record_gradients`
    /// waits, before the optimizer's step; code that changes a parameter earlier calls
    /// `StepRecorder::wait_for_background` first.
    pub fn record_parameters(&self, s: &mut StepRecorder) {
        s.record_variables_in_background(self.params.clone(), TensorKind::Weight, None);
    }

    /// The nodes of the graph behind `root`, named, in topological order (leaves first). Takes
    /// the step's scopes: call it once per step, after the forward pass.
    pub fn graph(&self, root: &Tensor) -> Result<Vec<GraphNode>, RecordError> {
        self.graph_after(root, None)
    }

    /// Forgets the scopes entered on this thread since the last graph was taken: those of a
    /// pass whose graph is not captured (which would otherwise number the next pass's anew).
    pub(crate) fn forget_scopes(&self) {
        take_step();
    }

    /// `graph`, keeping only the variables and the tensors created after the tensor numbered
    /// `after` (see `graph_nodes`).
    pub(crate) fn graph_after(&self, root: &Tensor, after: Option<u64>) -> Result<Vec<GraphNode>, RecordError> {
        named_graph(root, &self.by_id, &take_step(), after)
    }

    /// Records every node of the graph behind `root` except the parameters (which
    /// `record_parameters` names), in topological order; the root itself as `root_name` of kind
    /// `root_kind`. Call it once per step, after the forward pass: it takes the step's scopes.
    ///
    /// The graph is walked, named and its reads planned on the recorder's worker thread while this
    /// thread goes on: call it as soon as the root exists (before `backward()`), and the work
    /// overlaps the backward pass. Its records take their place in the step here. Some nodes are
    /// views that share a parameter's memory (a transposed weight, a broadcast bias), which the
    /// optimizer overwrites in place, so the step must wait for them before the optimizer's step:
    /// `record_gradients` does (as do `StepRecorder::wait_for_background` and `read_now`). A graph
    /// that cannot be recorded (no variable behind the root, a variable outside the model's) fails
    /// that wait, and the step is not written.
    pub fn record_graph(&self, s: &mut StepRecorder, root: &Tensor, root_name: &str, root_kind: TensorKind) {
        let spans = take_step();
        let (root, by_id, root_name) = (root.clone(), self.by_id.clone(), root_name.to_string());
        // This thread holds the root, and with it every node, until the job's work is done.
        s.record_in_background(Some(root.clone()), move |records| {
            let nodes = profile::time(profile::Phase::Graph, || named_graph(&root, &by_id, &spans, None))?;
            drop(root);
            // Checked before anything is recorded, so a refused graph leaves no partial step.
            if let Some(stray) = nodes.iter().find(|n| n.is_variable && !by_id.contains_key(&tensor_number(&n.tensor)))
            {
                return Err(RecordError::Unsupported(format!(
                    "the graph uses a variable that is not among the model's parameters (node {}, shape {:?}): \
                     create every Var through the VarMap given to the capture",
                    stray.position,
                    stray.tensor.dims()
                )));
            }
            // Views of the graph's own nodes, and of parameters recorded in this part (read in
            // the same flush, so the relation holds of the values recorded), are recorded as views.
            let in_part: BTreeSet<&str> = records.tensors.iter().map(|t| t.record.name.as_str()).collect();
            let mut views = views(&nodes, |n| !n.is_variable || in_part.contains(n.name.as_str()));
            let last = nodes.len() - 1;
            for (i, node) in nodes.into_iter().enumerate().filter(|(_, n)| !n.is_variable) {
                let (name, kind) =
                    if i == last { (root_name.clone(), root_kind) } else { (node.name, TensorKind::OpOutput) };
                let what = Described {
                    name,
                    kind,
                    phase: Some(Phase::Forward),
                    inputs: &[],
                    node: Some(node.position),
                    collective: None,
                    source: node.source,
                };
                let bytes = (node.tensor.elem_count() * node.tensor.dtype().size_in_bytes()) as u64;
                match views[i].take() {
                    // The root keeps its values (a loss, logits), and small views their inline ones.
                    Some(view) if i != last && records.derives_view_of(bytes) => {
                        records.push_view(what, &node.tensor, view)?
                    }
                    _ => records.push(what, &node.tensor, false)?,
                }
            }
            Ok(())
        });
    }

    /// The number of nodes `record_graph` records for `root`: every node of its graph but the
    /// variables.
    pub fn graph_len(&self, root: &Tensor) -> usize {
        root.sorted_nodes().iter().filter(|t| !t.is_variable()).count()
    }

    /// Records the gradient of every floating-point parameter as `NAME.grad` (phase backward),
    /// and notes in the trace those that received none. Returns their names. Waits for the
    /// step's graph (`record_graph`) to be read, so the optimizer may update the parameters,
    /// and the graph's views of them, right after. The gradients themselves, which an
    /// optimizer does not change, are read with the step's next read.
    pub fn record_gradients(&self, s: &mut StepRecorder, grads: &GradStore) -> Result<Vec<String>, RecordError> {
        let mut missing = Vec::new();
        for (name, var) in self.params.iter() {
            if !var.dtype().is_float() {
                continue;
            }
            match grads.get(var.as_tensor()) {
                Some(grad) => {
                    let grad_name = format!("{name}.grad");
                    s.record_as(&grad_name, TensorKind::Gradient, Some(Phase::Backward), &[], grad)?;
                }
                None => missing.push(name.clone()),
            }
        }
        s.note_no_gradient(missing.iter().cloned());
        s.wait_for_background()?;
        Ok(missing)
    }

    /// Records every parameter after the optimizer's update as `NAME.updated` (phase update), read
    /// when the step finishes: the parameters must not change before the next step's first wait,
    /// which the next step's `record_gradients` is, ahead of its optimizer's step.
    pub fn record_updated(&self, s: &mut StepRecorder) -> Result<(), RecordError> {
        let params = self.params.iter().map(|(n, v)| (n.as_str(), v));
        s.record_variables_later(params, ".updated", TensorKind::Weight, Some(Phase::Update))
    }
}

/// A `Recorder` that captures a model: the few lines a training loop adds to record itself.
pub struct ModelRecorder {
    recorder: Recorder,
    capture: ModelCapture,
    /// The parameter moved for the planted perturbation of the coming step, if any.
    planted: Option<Planted>,
}

/// A parameter moved for a planted perturbation (`REPRO_PERTURB`, `RecordOptions::perturbation`),
/// with its true value. The program computes its forward pass, and so its gradients, from the
/// moved value, as if the parameter had been off by that much; the true value is put back before
/// the step records its parameters, so the trace shows where the moved value was first read, as
/// the built-in workloads' traces do.
struct Planted {
    var: Var,
    original: Tensor,
}

impl Planted {
    /// Moves the parameter the recorder's perturbation names, when it targets `step`.
    fn at(recorder: &mut Recorder, capture: &ModelCapture, step: u64) -> Result<Option<Planted>, RecordError> {
        let Some(p) = recorder.perturbation().filter(|p| p.step == step).cloned() else { return Ok(None) };
        let Some((_, var)) = capture.params.iter().find(|(name, _)| *name == p.tensor) else { return Ok(None) };
        recorder.planting()?;
        let original = var.as_tensor().copy()?;
        var.set(&p.apply(step, &p.tensor, &original)?)?;
        Ok(Some(Planted { var: var.clone(), original }))
    }

    fn restore(self) -> Result<(), RecordError> {
        Ok(self.var.set(&self.original)?)
    }
}

impl ModelRecorder {
    /// Records into `dir` (which must not hold a trace), capturing the parameters of `varmap`:
    /// hashes at every step, full values at the first and last.
    pub fn create(
        dir: impl AsRef<Path>,
        run: RunConfig,
        device: &Device,
        varmap: &VarMap,
    ) -> Result<Self, RecordError> {
        Self::create_with(dir, run, device, varmap, RecordOptions::default())
    }

    /// Records into `dir` as `options` say (capture policy, replacing, an online comparison
    /// with a reference run: `RecordOptions::comparing_with`), capturing the parameters of
    /// `varmap`.
    pub fn create_with(
        dir: impl AsRef<Path>,
        run: RunConfig,
        device: &Device,
        varmap: &VarMap,
        options: RecordOptions,
    ) -> Result<Self, RecordError> {
        let recorder = Recorder::create(dir, run, device, options)?;
        Self::new(recorder, ModelCapture::new(varmap))
    }

    /// Captures into a recorder made by any of `Recorder`'s constructors (`from_env` for
    /// `repro gate -- CMD`, another capture policy, online comparison). A perturbation of a
    /// parameter at step 0 moves it now: create the recorder once the model's initial values
    /// are set.
    pub fn new(mut recorder: Recorder, capture: ModelCapture) -> Result<Self, RecordError> {
        let planted = Planted::at(&mut recorder, &capture, 0)?;
        Ok(ModelRecorder { recorder, capture, planted })
    }

    /// The underlying recorder.
    pub fn recorder(&mut self) -> &mut Recorder {
        &mut self.recorder
    }

    /// The capture (parameters by name).
    pub fn capture(&self) -> &ModelCapture {
        &self.capture
    }

    /// Records a training step up to its update: the `inputs` (data, as kind `input`), the
    /// parameters, every node of the graph behind `loss`, and the gradients. Run the optimizer
    /// step, then call `finish` on the result to record the updated parameters.
    pub fn training_step(
        &mut self,
        step: u64,
        inputs: &[(&str, &Tensor)],
        loss: &Tensor,
        grads: &GradStore,
    ) -> Result<CapturedStep<'_>, RecordError> {
        if let Some(planted) = self.planted.take() {
            planted.restore()?;
        }
        let mut s = self.recorder.step(step);
        for (name, tensor) in inputs {
            s.record(name, TensorKind::Input, tensor)?;
        }
        self.capture.record_parameters(&mut s);
        self.capture.record_graph(&mut s, loss, "loss", TensorKind::Loss);
        self.capture.record_gradients(&mut s, grads)?;
        Ok(CapturedStep { step: s, number: step, capture: &self.capture, planted: &mut self.planted })
    }

    /// Records one forward pass at inference: the `inputs`, the parameters and every node of
    /// the graph behind `logits` (recorded as `logits`, kind prediction).
    pub fn forward_step(&mut self, step: u64, inputs: &[(&str, &Tensor)], logits: &Tensor) -> Result<(), RecordError> {
        if let Some(planted) = self.planted.take() {
            planted.restore()?;
        }
        let mut s = self.recorder.step(step);
        for (name, tensor) in inputs {
            s.record(name, TensorKind::Input, tensor)?;
        }
        self.capture.record_parameters(&mut s);
        self.capture.record_graph(&mut s, logits, "logits", TensorKind::Prediction);
        let recorder = s.finish_step()?;
        self.planted = Planted::at(recorder, &self.capture, step + 1)?;
        Ok(())
    }

    /// Marks the trace complete; returns the number of steps recorded.
    pub fn finish(self) -> Result<u64, RecordError> {
        self.recorder.finish()
    }
}

/// A training step recorded up to its update (see `ModelRecorder::training_step`).
pub struct CapturedStep<'a> {
    step: StepRecorder<'a>,
    number: u64,
    capture: &'a ModelCapture,
    planted: &'a mut Option<Planted>,
}

impl<'a> CapturedStep<'a> {
    /// The step recorder, to record more tensors of this step.
    pub fn recorder(&mut self) -> &mut StepRecorder<'a> {
        &mut self.step
    }

    /// Records the parameters as updated by the optimizer, and writes the step.
    pub fn finish(mut self) -> Result<(), RecordError> {
        self.capture.record_updated(&mut self.step)?;
        let recorder = self.step.finish_step()?;
        *self.planted = Planted::at(recorder, self.capture, self.number + 1)?;
        Ok(())
    }
}

/// The named nodes behind `root` (see `graph_nodes`); an error if no variable is among them.
fn named_graph(
    root: &Tensor,
    variables: &BTreeMap<u64, String>,
    spans: &[ScopeSpan],
    after: Option<u64>,
) -> Result<Vec<GraphNode>, RecordError> {
    let nodes = graph_nodes(root, variables, spans, after);
    if nodes.is_empty() {
        return Err(RecordError::Unsupported(
            "the root tensor depends on no variable, so it has no graph to capture: compute it from the \
             model's output, and build the model on a VarMap (candle_nn::VarBuilder::from_varmap)"
                .into(),
        ));
    }
    Ok(nodes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::DType;

    fn linear_model(varmap: &VarMap) -> candle_nn::Linear {
        let vb = candle_nn::VarBuilder::from_varmap(varmap, DType::F32, &Device::Cpu);
        candle_nn::linear(3, 2, vb.pp("fc")).unwrap()
    }

    #[test]
    fn a_root_without_variables_has_no_graph_and_says_what_to_do() {
        let varmap = VarMap::new();
        let capture = ModelCapture::new(&varmap);
        let data = Tensor::ones(4, DType::F32, &Device::Cpu).unwrap().sum_all().unwrap();
        let err = capture.graph(&data).unwrap_err().to_string();
        assert!(err.contains("depends on no variable") && err.contains("VarMap"), "{err}");
    }

    #[test]
    fn a_variable_outside_the_capture_is_refused() {
        use candle_core::Module;
        let known = VarMap::new();
        let model = linear_model(&known);
        let stray = Var::ones(2, DType::F32, &Device::Cpu).unwrap();
        let x = Tensor::ones((1, 3), DType::F32, &Device::Cpu).unwrap();
        let loss = model.forward(&x).unwrap().broadcast_mul(stray.as_tensor()).unwrap().sum_all().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut rec =
            Recorder::create(dir.path().join("t"), RunConfig::default(), &Device::Cpu, RecordOptions::default())
                .unwrap();
        let mut s = rec.step(0);
        // The graph is named on the worker thread: its error comes with the step's next read.
        ModelCapture::new(&known).record_graph(&mut s, &loss, "loss", TensorKind::Loss);
        let err = s.read_now().unwrap_err();
        assert!(err.to_string().contains("not among the model's parameters"), "{err}");
        // With every variable known, the same graph records, in a step of its own.
        let all = ModelCapture::from_vars(
            known.data().lock().unwrap().iter().map(|(n, v)| (n.clone(), v.clone())).chain([("stray".into(), stray)]),
        );
        drop(s);
        let mut s = rec.step(1);
        all.record_graph(&mut s, &loss, "loss", TensorKind::Loss);
        s.finish().unwrap();
        rec.finish().unwrap();
        let mut reader = crate::trace::TraceReader::open(dir.path().join("t")).unwrap();
        let step = reader.next_step().unwrap().unwrap();
        assert_eq!(step.step, 1, "the refused step is not in the trace");
        assert_eq!(step.tensors.len(), all.graph_len(&loss));
    }

    /// `forward_step` records an inference pass: the inputs, the parameters and every node of
    /// the graph behind the logits, the logits as a prediction, and no gradient or update.
    #[test]
    fn a_forward_pass_records_inputs_parameters_and_the_graph_to_the_logits() {
        use candle_core::Module;
        let varmap = VarMap::new();
        let model = linear_model(&varmap);
        let x = Tensor::ones((1, 3), DType::F32, &Device::Cpu).unwrap();
        let logits = model.forward(&x).unwrap().relu().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let capture = ModelCapture::new(&varmap);
        let nodes = capture.graph_len(&logits);
        let recorder =
            Recorder::create(dir.path().join("t"), RunConfig::default(), &Device::Cpu, RecordOptions::default())
                .unwrap();
        let mut rec = ModelRecorder::new(recorder, capture).unwrap();
        rec.forward_step(0, &[("x", &x)], &logits).unwrap();
        assert_eq!(rec.finish().unwrap(), 1);
        let mut reader = crate::trace::TraceReader::open(dir.path().join("t")).unwrap();
        let step = reader.next_step().unwrap().unwrap();
        let kind = |name: &str| step.tensors.iter().find(|t| t.name == name).map(|t| t.kind);
        assert_eq!(kind("x"), Some(TensorKind::Input));
        assert_eq!(kind("fc.weight"), Some(TensorKind::Weight));
        assert_eq!(kind("logits"), Some(TensorKind::Prediction));
        assert!(step.tensors.iter().all(|t| t.kind != TensorKind::Gradient && !t.name.ends_with(".updated")));
        assert_eq!(step.tensors.iter().filter(|t| t.node.is_some()).count(), nodes);
    }

    /// A graph recorded on the worker thread takes its place in the step: after what was
    /// recorded before `record_graph`, before what was recorded after it.
    #[test]
    fn a_graph_recorded_in_the_background_keeps_its_place_in_the_step() {
        use candle_core::Module;
        let varmap = VarMap::new();
        let model = linear_model(&varmap);
        let x = Tensor::ones((1, 3), DType::F32, &Device::Cpu).unwrap();
        let loss = model.forward(&x).unwrap().sum_all().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut rec =
            Recorder::create(dir.path().join("t"), RunConfig::default(), &Device::Cpu, RecordOptions::default())
                .unwrap();
        let capture = ModelCapture::new(&varmap);
        let mut s = rec.step(0);
        s.record("x", TensorKind::Input, &x).unwrap();
        capture.record_graph(&mut s, &loss, "loss", TensorKind::Loss);
        s.record("after", TensorKind::Input, &x).unwrap();
        let grads = loss.backward().unwrap();
        capture.record_gradients(&mut s, &grads).unwrap();
        s.finish().unwrap();
        rec.finish().unwrap();
        let mut reader = crate::trace::TraceReader::open(dir.path().join("t")).unwrap();
        let names: Vec<String> = reader.next_step().unwrap().unwrap().tensors.into_iter().map(|t| t.name).collect();
        let at = |name: &str| names.iter().position(|n| n == name).unwrap_or_else(|| panic!("{name} in {names:?}"));
        assert_eq!(at("x"), 0);
        assert_eq!(at("loss"), capture.graph_len(&loss), "the graph's nodes follow `x`: {names:?}");
        assert_eq!(at("after"), at("loss") + 1, "{names:?}");
        assert!(at("fc.weight.grad") > at("after"), "{names:?}");
        // A name the graph shares with a tensor recorded by hand is refused when they meet.
        let mut again =
            Recorder::create(dir.path().join("u"), RunConfig::default(), &Device::Cpu, RecordOptions::default())
                .unwrap();
        let mut step = again.step(0);
        step.record("loss", TensorKind::Loss, &loss).unwrap();
        capture.record_graph(&mut step, &loss, "loss", TensorKind::Loss);
        let err = step.finish().unwrap_err().to_string();
        assert!(err.contains("`loss` recorded twice in step 0"), "{err}");
    }

    /// Nodes that read another node's or a parameter's memory (a transposed weight, a broadcast
    /// bias, a transpose and a narrow of an activation) are recorded as views of it (format 1.5),
    /// and read back through their layouts they are the nodes' own values; nodes of memory of
    /// their own, and views too small to leave the record, keep their values' hashes.
    #[test]
    fn views_read_back_as_the_nodes_values() {
        use crate::hash::tensor_hash;
        use candle_core::Module;
        let varmap = VarMap::new();
        let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let fc = candle_nn::linear(32, 48, vb.pp("fc")).unwrap();
        let x = Tensor::arange(0f32, 256.0, &Device::Cpu).unwrap().reshape((8, 32)).unwrap().affine(0.01, 0.0).unwrap();
        let h = fc.forward(&x).unwrap();
        let window = h.t().unwrap().narrow(0, 4, 40).unwrap();
        let loss = window.sqr().unwrap().sum_all().unwrap();
        // Each node's own values, by position in the graph.
        let capture = ModelCapture::new(&varmap);
        let expected: BTreeMap<u64, crate::hash::TensorHash> = capture
            .graph(&loss)
            .unwrap()
            .into_iter()
            .map(|n| {
                let dtype = crate::record::trace_dtype(n.tensor.dtype()).unwrap();
                let shape: Vec<u64> = n.tensor.dims().iter().map(|&d| d as u64).collect();
                let hash = crate::record::with_canonical_bytes(&n.tensor, |b| tensor_hash(dtype, &shape, b)).unwrap();
                (n.position, hash)
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let mut rec = ModelRecorder::create(dir.path().join("t"), RunConfig::default(), &Device::Cpu, &varmap).unwrap();
        let grads = loss.backward().unwrap();
        rec.training_step(0, &[("x", &x)], &loss, &grads).unwrap().finish().unwrap();
        rec.finish().unwrap();
        let mut reader = crate::trace::TraceReader::open(dir.path().join("t")).unwrap();
        let step = reader.next_step().unwrap().unwrap();
        let mut owners = BTreeSet::new();
        for t in step.tensors.iter().filter(|t| t.node.is_some()) {
            let values = reader.values(&step, t).unwrap().expect("the first step stores every value");
            let own = tensor_hash(t.dtype, &t.shape, &values.bytes);
            assert_eq!(own, expected[&t.node.unwrap()], "`{}`: {:?}", t.name, t.view);
            match &t.view {
                Some(view) => {
                    owners.insert(view.of.clone());
                }
                None => assert_eq!(own, t.hash, "`{}` is hashed by its values", t.name),
            }
        }
        // The weight transposed and broadcast, the bias broadcast, and the product transposed.
        assert!(owners.contains("fc.weight") && owners.contains("fc.bias"), "{owners:?}");
        assert!(owners.iter().any(|o| o != "fc.weight" && o != "fc.bias"), "a view of a node: {owners:?}");
    }

    #[test]
    fn parameters_cut_off_by_an_op_without_backward_are_reported() {
        use candle_core::Module;
        let varmap = VarMap::new();
        let model = linear_model(&varmap);
        let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let (alpha, beta) = (vb.get(2, "norm.weight").unwrap(), vb.get(2, "norm.bias").unwrap());
        let x = Tensor::ones((1, 3), DType::F32, &Device::Cpu).unwrap();
        // candle's fused layer norm has no backward pass: fc and the norm's own parameters
        // receive nothing.
        let y = candle_nn::ops::layer_norm(&model.forward(&x).unwrap(), &alpha, &beta, 1e-5).unwrap();
        let head = vb.get((2, 2), "head.weight").unwrap();
        let loss = y.matmul(&head).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut rec =
            Recorder::create(dir.path().join("t"), RunConfig::default(), &Device::Cpu, RecordOptions::default())
                .unwrap();
        let mut s = rec.step(0);
        let missing = ModelCapture::new(&varmap).record_gradients(&mut s, &grads).unwrap();
        assert_eq!(missing, ["fc.bias", "fc.weight", "norm.bias", "norm.weight"]);
        s.finish().unwrap();
        rec.finish().unwrap();
        let mut reader = crate::trace::TraceReader::open(dir.path().join("t")).unwrap();
        assert_eq!(reader.next_step().unwrap().unwrap().no_gradient, missing);
    }

    #[test]
    fn a_graph_of_a_hundred_thousand_nodes_records_in_one_step() {
        let varmap = VarMap::new();
        let vb = candle_nn::VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let w = vb.get(1, "w").unwrap();
        // 100,000 one-element nodes computed from the parameter, joined by one concatenation.
        let parts: Vec<Tensor> = (0..100_000).map(|i| w.affine(1.0, i as f64).unwrap()).collect();
        let root = Tensor::cat(&parts, 0).unwrap().sum_all().unwrap();
        drop(parts);
        let dir = tempfile::tempdir().unwrap();
        let policy = crate::trace::CapturePolicy { full: crate::trace::FullCapture::None, ..Default::default() };
        let mut rec =
            Recorder::create(dir.path().join("t"), RunConfig::default(), &Device::Cpu, RecordOptions::capture(policy))
                .unwrap();
        let mut s = rec.step(0);
        let capture = ModelCapture::new(&varmap);
        let recorded = capture.graph_len(&root);
        capture.record_graph(&mut s, &root, "root", TensorKind::Loss);
        drop(root);
        s.finish().unwrap();
        rec.finish().unwrap();
        assert!(recorded >= 100_002, "{recorded} nodes");
        let mut reader = crate::trace::TraceReader::open(dir.path().join("t")).unwrap();
        assert_eq!(reader.next_step().unwrap().unwrap().tensors.len(), recorded);
    }
}

//! The recorder's unit tests: steps recorded, skipped, with parts from the worker, and in order.

use super::*;
use std::cell::RefCell;
use std::rc::Rc;

/// Steps recorded on the host have nothing to wait for: each is reported (and handed to
/// the writer) when it finishes, not held back like a GPU step, so a crash loses no
/// finished step.
#[test]
fn a_host_step_is_completed_when_it_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = seen.clone();
    let options = RecordOptions::default().on_step(move |p| log.borrow_mut().push(p.step));
    let mut recorder = recorder_in(&dir.path().join("t"), options);
    for step in 0..3 {
        let mut s = recorder.step(step);
        s.record("x", TensorKind::Input, &Tensor::new(&[step as f32], &Device::Cpu).unwrap()).unwrap();
        s.finish().unwrap();
        assert_eq!(*seen.borrow(), (0..=step).collect::<Vec<_>>(), "step {step} reported at its finish");
    }
    assert_eq!(recorder.finish().unwrap(), 3);
}

/// Steps that `RecordOptions::recording_only` leaves out cost nothing and leave nothing behind: not in the
/// trace, not numbered, no note of theirs kept for a later step.
#[test]
fn steps_left_out_are_neither_recorded_nor_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let asked = Rc::new(RefCell::new(Vec::new()));
    let log = asked.clone();
    let options = RecordOptions::default().recording_only(move |step| {
        log.borrow_mut().push(step);
        step % 3 == 0
    });
    let mut recorder = recorder_in(&dir.path().join("t"), options);
    for step in 0..7 {
        let mut s = recorder.step(step);
        assert_eq!(s.is_recording(), step % 3 == 0);
        s.record("x", TensorKind::Input, &Tensor::new(&[step as f32], &Device::Cpu).unwrap()).unwrap();
        s.note_no_gradient([format!("w{step}")]);
        s.finish().unwrap();
    }
    assert_eq!(recorder.finish().unwrap(), 3);
    assert_eq!(*asked.borrow(), (0..7).collect::<Vec<_>>(), "asked once per step, in order");
    let mut reader = crate::trace::TraceReader::open(dir.path().join("t")).unwrap();
    let mut seen = Vec::new();
    while let Some(step) = reader.next_step().unwrap() {
        assert_eq!(step.no_gradient, [format!("w{}", step.step)], "only the step's own note");
        seen.push(step.step);
    }
    assert_eq!(seen, [0, 3, 6]);
}

/// A CPU recorder writing into `dir`, as `options` say.
fn recorder_in(dir: &Path, options: RecordOptions) -> Recorder {
    Recorder::create(dir, RunConfig::default(), &Device::Cpu, options).unwrap()
}

/// The names and hashes of every step of the trace in `dir`.
fn steps_of(dir: &Path) -> Vec<(u64, Vec<(String, String)>)> {
    let mut reader = crate::trace::TraceReader::open(dir).unwrap();
    let mut steps = Vec::new();
    while let Some(step) = reader.next_step().unwrap() {
        let tensors = step.tensors.into_iter().map(|t| (t.name, t.hash.to_string())).collect();
        steps.push((step.step, tensors));
    }
    steps
}

/// The parameters and the graph are read on the worker thread; their records still take the
/// places they were asked for: input, parameters, graph (its root last), gradients, updated
/// parameters. Two runs give the same trace.
#[test]
fn parts_from_the_worker_take_their_places_and_two_runs_agree() {
    use crate::capture::ModelCapture;
    use candle_core::{DType, Module};
    let dir = tempfile::tempdir().unwrap();
    let mut traces = Vec::new();
    for run in 0..2 {
        let weight =
            Var::from_tensor(&Tensor::new(&[[0.5f32, -1.0, 0.25], [2.0, 0.125, -0.75]], &Device::Cpu).unwrap())
                .unwrap();
        let bias = Var::zeros(2, DType::F32, &Device::Cpu).unwrap();
        let model = candle_nn::Linear::new(weight.as_tensor().clone(), Some(bias.as_tensor().clone()));
        let capture =
            ModelCapture::from_vars([("fc.weight".to_string(), weight.clone()), ("fc.bias".into(), bias.clone())]);
        let mut opt = <candle_nn::SGD as candle_nn::Optimizer>::new(vec![weight, bias], 0.1).unwrap();
        let path = dir.path().join(format!("{run}"));
        let mut recorder = recorder_in(&path, RecordOptions::default());
        for step in 0..4 {
            let x = Tensor::new(&[[step as f32, 1.0, -2.0]], &Device::Cpu).unwrap();
            let mut s = recorder.step(step);
            s.record("x", TensorKind::Input, &x).unwrap();
            capture.record_parameters(&mut s);
            let loss = model.forward(&x).unwrap().sqr().unwrap().sum_all().unwrap();
            capture.record_graph(&mut s, &loss, "loss", TensorKind::Loss);
            let grads = loss.backward().unwrap();
            capture.record_gradients(&mut s, &grads).unwrap();
            candle_nn::Optimizer::step(&mut opt, &grads).unwrap();
            capture.record_updated(&mut s).unwrap();
            s.finish().unwrap();
        }
        assert_eq!(recorder.finish().unwrap(), 4);
        traces.push(steps_of(&path));
    }
    assert_eq!(traces[0].len(), 4);
    let names: Vec<&str> = traces[0][0].1.iter().map(|(name, _)| name.as_str()).collect();
    let at = |name: &str| names.iter().position(|n| *n == name).unwrap_or_else(|| panic!("{name} in {names:?}"));
    assert_eq!(&names[..3], ["x", "fc.bias", "fc.weight"], "{names:?}");
    assert!(at("loss") > 3, "graph nodes before the root: {names:?}");
    assert_eq!(&names[at("loss") + 1..], ["fc.bias.grad", "fc.weight.grad", "fc.bias.updated", "fc.weight.updated"]);
    assert_eq!(traces[0], traces[1]);
}

/// An error in a part from the worker (a name recorded twice) comes with the step's finish,
/// and the step is not written.
#[test]
fn an_error_in_a_part_from_the_worker_fails_the_step_and_the_step_is_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t");
    let mut recorder = recorder_in(&path, RecordOptions::default());
    let x = Tensor::new(&[1f32], &Device::Cpu).unwrap();
    let mut s = recorder.step(0);
    s.record("x", TensorKind::Input, &x).unwrap();
    s.finish().unwrap();
    let mut s = recorder.step(1);
    let twice = x.clone();
    s.record("x", TensorKind::Input, &x).unwrap();
    s.record_in_background(None, move |records| {
        let what = Described {
            name: "x".into(),
            kind: TensorKind::Input,
            phase: None,
            inputs: &[],
            node: None,
            collective: None,
            source: None,
        };
        records.push(what, &twice, false)
    });
    let err = s.finish().unwrap_err().to_string();
    assert!(err.contains("`x` recorded twice in step 1"), "{err}");
    recorder.finish().unwrap();
    assert_eq!(steps_of(&path).iter().map(|(step, _)| *step).collect::<Vec<_>>(), [0]);
}

/// Values stream to the payload file only where the trace stores them as they come: not while
/// comparing online, whose check reads the step's values from memory before it is written.
#[test]
fn a_step_compared_online_keeps_its_values_in_memory() {
    struct Same;
    impl crate::trace::StepCheck for Same {
        fn check_step(
            &mut self,
            _: u64,
            _: &[StepTensor],
        ) -> Result<crate::trace::StepVerdict, crate::trace::TraceError> {
            Ok(crate::trace::StepVerdict::Same)
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let all = CapturePolicy { full: crate::trace::FullCapture::All, ..CapturePolicy::default() };
    let mut plain = recorder_in(&dir.path().join("plain"), RecordOptions::capture(all.clone()));
    assert!(plain.step(0).records.stream.is_some(), "a step that stores full values streams them");
    let options = RecordOptions::capture(all).comparing_with(Box::new(Same), true);
    let mut compared = recorder_in(&dir.path().join("compared"), options);
    assert!(compared.step(0).records.stream.is_none());
}

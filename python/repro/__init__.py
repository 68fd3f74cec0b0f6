"""repro from Python: one import root for the trace format and the PyTorch recorder.

- `repro.trace`: reads and verifies traces (a second reader of docs/trace-format.md, independent
  of the Rust one; `python -m repro.trace verify TRACE`);
- `repro.writer`: writes traces (`TraceWriter`);
- `repro.torch`: records PyTorch training and inference (`ModelRecorder`, `Recorder`, the
  Trainer and Lightning callbacks in `repro.torch.trainer` and `repro.torch.lightning`);
- `repro.study`: the cuDNN studies (`python -m repro.study`).

The wheel (`make wheel`) installs this package together with the `repro` command. The older
top-level names `repro_trace`, `repro_writer`, `repro_torch` and `repro_study` still import, as
the same modules (`repro._old_names`).
"""

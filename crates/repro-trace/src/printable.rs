//! Strings a trace holds are printable: reports print tensor names, workload names, settings
//! and reasons to terminals, where a control character could move the cursor, recolor the
//! screen or start a forged line (`IDENTICAL ...`). Writers refuse such strings and readers
//! treat them as corruption (docs/trace-format.md, section 7).

use crate::schema::{Header, TensorRecord};

/// Why a string a trace holds cannot be printed as it is: the first control character in it
/// (U+0000 to U+001F, U+007F to U+009F), or `None`. Reports print tensor names, workload names,
/// settings and reasons to terminals, where such a character could move the cursor, recolor the
/// screen or start a forged line (`IDENTICAL ...`); so writers refuse them and readers treat
/// them as corruption. `field` says which string, for the message, which shows it escaped.
pub fn unprintable(field: &str, value: &str) -> Option<String> {
    let c = value.chars().find(|c| c.is_control())?;
    Some(format!(
        "{field} \"{}\" holds the control character U+{:04X}; strings in a trace must be printable",
        value.escape_debug(),
        c as u32
    ))
}

/// The header's strings that reports print, each with what it is.
pub fn header_strings(header: &Header) -> Vec<(String, &str)> {
    let (run, env) = (&header.run, &header.environment);
    let mut strings = vec![
        ("the producer".to_string(), header.producer.as_str()),
        ("the workload".to_string(), run.workload.as_str()),
        ("the device".to_string(), env.device.as_str()),
        ("the device name".to_string(), env.device_name.as_str()),
        ("the CPU model".to_string(), env.cpu_model.as_str()),
        ("the OS".to_string(), env.os.as_str()),
        ("the rustc version".to_string(), env.rustc.as_str()),
        ("the repro version".to_string(), env.repro_version.as_str()),
        ("the candle version".to_string(), env.candle_version.as_str()),
    ];
    if let Some(d) = &header.distributed {
        strings.push(("the collective backend".to_string(), d.backend.as_str()));
        strings.push(("the backend's version".to_string(), d.backend_version.as_str()));
    }
    for (key, value) in &run.params {
        strings.push(("a setting's name".to_string(), key.as_str()));
        strings.push((format!("setting `{}`", key.escape_debug()), value.as_str()));
    }
    for (key, value) in &env.env {
        strings.push(("an environment variable's name".to_string(), key.as_str()));
        strings.push((format!("variable `{}`", key.escape_debug()), value.as_str()));
    }
    strings
}

/// The first unprintable string of a tensor record (its name, inputs, collective), as a message.
pub fn unprintable_in_tensor(t: &TensorRecord) -> Option<String> {
    unprintable("tensor name", &t.name)
        .or_else(|| t.inputs.iter().find_map(|i| unprintable("an input's name", i)))
        .or_else(|| t.collective.as_deref().and_then(|c| unprintable("the collective", c)))
        .or_else(|| t.reduce_scatter.as_deref().and_then(|c| unprintable("the reduce-scatter", c)))
        .or_else(|| t.source.as_deref().and_then(|s| unprintable("the source location", s)))
}

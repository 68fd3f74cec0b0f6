//! What differs between two runs' headers: their settings (workload, steps, parameters) and
//! their environments (device, versions, threads, ranks, variables), each in a fixed order.

use super::FieldDifference;
use repro_trace::{Header, RunConfig};
use std::collections::BTreeMap;

/// Differences between the headers' run configs and environments, in a fixed order.
pub fn header_differences(a: &Header, b: &Header) -> (Vec<FieldDifference>, Vec<FieldDifference>) {
    let config = config_differences(&a.run, &b.run);
    let (ea, eb) = (&a.environment, &b.environment);
    let mut env = Vec::new();
    let fields: [(&str, &String, &String); 7] = [
        ("device", &ea.device, &eb.device),
        ("device_name", &ea.device_name, &eb.device_name),
        ("cpu_model", &ea.cpu_model, &eb.cpu_model),
        ("os", &ea.os, &eb.os),
        ("repro_version", &ea.repro_version, &eb.repro_version),
        ("candle_version", &ea.candle_version, &eb.candle_version),
        ("rustc", &ea.rustc, &eb.rustc),
    ];
    for (name, x, y) in fields {
        push_if_differs(&mut env, name, Some(x), Some(y));
    }
    push_if_differs(&mut env, "threads", Some(&ea.threads.to_string()), Some(&eb.threads.to_string()));
    // Data parallelism: how many ranks, over what. A stream's own rank is not a difference.
    let world = |h: &Header| h.distributed.as_ref().map_or("1".to_string(), |d| d.world_size.to_string());
    let backend =
        |h: &Header| h.distributed.as_ref().map(|d| format!("{} {}", d.backend, d.backend_version).trim().to_string());
    push_if_differs(&mut env, "world_size", Some(&world(a)), Some(&world(b)));
    push_if_differs(&mut env, "collective", backend(a).as_ref(), backend(b).as_ref());
    map_differences(&mut env, "env.", &ea.env, &eb.env);
    (config, env)
}

/// Differences between two run configs: workload, steps, then every setting, in a fixed order.
pub fn config_differences(a: &RunConfig, b: &RunConfig) -> Vec<FieldDifference> {
    let mut config = Vec::new();
    push_if_differs(&mut config, "workload", Some(&a.workload), Some(&b.workload));
    push_if_differs(
        &mut config,
        "steps",
        a.steps.map(|s| s.to_string()).as_ref(),
        b.steps.map(|s| s.to_string()).as_ref(),
    );
    map_differences(&mut config, "", &a.params, &b.params);
    config
}

fn push_if_differs(out: &mut Vec<FieldDifference>, field: &str, a: Option<&String>, b: Option<&String>) {
    if a != b {
        out.push(FieldDifference { field: field.to_string(), a: a.cloned(), b: b.cloned() });
    }
}

fn map_differences(
    out: &mut Vec<FieldDifference>,
    prefix: &str,
    a: &BTreeMap<String, String>,
    b: &BTreeMap<String, String>,
) {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for key in keys {
        push_if_differs(out, &format!("{prefix}{key}"), a.get(key), b.get(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use repro_trace::{CapturePolicy, Distributed, Environment, FormatVersion};

    fn header(device: &str, threads: u64, world: Option<u64>, env: &[(&str, &str)], params: &[(&str, &str)]) -> Header {
        let map = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Header {
            format: FormatVersion { major: 1, minor: 7 },
            producer: "test".into(),
            run: RunConfig { workload: "adder".into(), steps: Some(3), params: map(params) },
            environment: Environment { device: device.into(), threads, env: map(env), ..Default::default() },
            capture: CapturePolicy::default(),
            distributed: world.map(|world_size| Distributed {
                rank: 1,
                world_size,
                backend: "nccl".into(),
                backend_version: "2.28.9".into(),
            }),
            data_hash: Default::default(),
        }
    }

    #[test]
    fn differences_come_in_a_fixed_order_and_a_streams_own_rank_is_none() {
        let a = header("cpu", 2, None, &[("B", "1"), ("A", "x")], &[("lr", "0.1"), ("batch", "4")]);
        let b = header("cuda:0", 2, Some(2), &[("A", "y")], &[("batch", "8"), ("lr", "0.1")]);
        let (config, env) = header_differences(&a, &b);
        let fields = |d: &[FieldDifference]| d.iter().map(|f| f.field.clone()).collect::<Vec<_>>();
        assert_eq!(fields(&config), ["batch"]);
        assert_eq!(config[0].values(), ("4", "8"));
        assert_eq!(fields(&env), ["device", "world_size", "collective", "env.A", "env.B"]);
        assert_eq!(env[2].values().1, "nccl 2.28.9");
        assert_eq!(env[4].b, None, "a variable set in one run only");
        // Two ranks of one run differ in nothing but their rank.
        let (config, env) = header_differences(&header("cuda:0", 2, Some(2), &[], &[]), &{
            let mut other = header("cuda:0", 2, Some(2), &[], &[]);
            other.distributed.as_mut().unwrap().rank = 0;
            other
        });
        assert!(config.is_empty() && env.is_empty(), "{config:?} {env:?}");
    }
}

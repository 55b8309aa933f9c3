//! `cellmesh <role> --check-config FILE` and `cellmesh plan` as an
//! operator (or Terraform's cloud-init) runs them: the real binary, exit
//! codes and what it prints.

use std::process::Output;

use cellmesh_tests::*;

fn run(args: &[&str]) -> Output {
    std::process::Command::new(cellmesh_bin())
        .args(args)
        .output()
        .expect("run cellmesh")
}

fn config(name: &str) -> String {
    format!("{}/../config/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_role_accepts_its_shipped_config_and_starts_nothing() {
    for role in ["cell", "router", "edge", "control-plane"] {
        let file = config(&format!("{role}.toml"));
        let out = run(&[role, "--check-config", &file]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{role}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("a valid {role} config")),
            "{role}: {stdout}"
        );
    }
}

#[test]
fn a_bad_config_exits_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("cell", "instance_id = 5000\n", "instance_id"),
        ("cell", "[storage]\nbogus = 1\n", "bogus"),
        ("edge", "token_secret = \"short\"\n", "token_secret"),
        ("router", "node_id = 0\n", "node_id"),
        ("control-plane", "routers = []\n", "routers"),
        // Built without TLS: an https:// endpoint is refused up front.
        (
            "edge",
            "routers = [\"https://router-1.internal:7300\"]\n",
            "TLS is not built in",
        ),
        (
            "cell",
            "[routing]\nrouters = [\"router-1:7300\"]\n",
            "routing.routers",
        ),
        (
            "router",
            "advertise_api = \"https://r:7300\"\n",
            "advertise_api",
        ),
        // Every numeric setting has a range, in every role.
        (
            "router",
            "[raft]\nheartbeat_ms = 18446744073709551615\n",
            "raft.heartbeat_ms",
        ),
        (
            "edge",
            "token_secret = \"a-long-enough-secret\"\nretry_deadline_ms = 18446744073709551615\n",
            "retry_deadline_ms",
        ),
        (
            "control-plane",
            "[migrations]\ntenant_parallel = 0\n",
            "migrations.tenant_parallel",
        ),
        (
            "control-plane",
            "probe_interval_ms = 18446744073709551615\n",
            "probe_interval_ms",
        ),
        // Traces: a ratio is a share, an endpoint a URL.
        (
            "cell",
            "[telemetry]\nsample_ratio = 1.5\n",
            "telemetry.sample_ratio",
        ),
        (
            "router",
            "[telemetry]\nendpoint = \"collector:4317\"\n",
            "telemetry.endpoint",
        ),
        ("control-plane", "traces_url = \"ftp://x\"\n", "traces_url"),
        // A console beyond loopback asks for a credential.
        (
            "control-plane",
            "console_listen = \"0.0.0.0:7100\"\n",
            "console_token",
        ),
        // TLS: all three files or none; each readable.
        (
            "cell",
            "[tls]\nca_file = \"/nonexistent/ca.pem\"\n",
            "tls.ca_file",
        ),
        (
            "router",
            "[tls]\ncert_file = \"/nonexistent/r.pem\"\n",
            "tls.ca_file",
        ),
    ];
    for (i, (role, text, field)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let out = run(&[role, "--check-config", file.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{role} {text:?}: {stderr}");
        assert!(stderr.contains(field), "{role} {text:?}: {stderr}");
    }
    // A file that is not there is named.
    let out = run(&["cell", "--check-config", "/nonexistent/cell.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/cell.toml"));
}

#[test]
fn plan_writes_tfvars_for_every_region() {
    let dir = tempfile::tempdir().unwrap();
    let tfvars = dir.path().join("plan.tfvars.json");
    let out = run(&[
        "plan",
        "--dau",
        "1000000",
        "--regions",
        "eu-west-1,us-east-1,ap-southeast-1",
        "--json",
        "--tfvars",
        tfvars.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["messages_per_day"], 60e6);
    assert_eq!(plan["router_replicas"], 3);
    let vars: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&tfvars).unwrap()).unwrap();
    let regions = vars["regions"].as_object().unwrap();
    assert_eq!(regions.len(), 3);
    assert!(regions.values().all(|r| r["cells"].as_u64().unwrap() >= 2));
    // A load no plan answers: exit 2, the flag named.
    let out = run(&["plan", "--dau", "0"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dau"));
}

#[test]
fn a_role_without_tls_refuses_to_start_unless_its_config_accepts_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    for role in ["cell", "router", "edge", "control-plane"] {
        let base = match role {
            "edge" => "token_secret = \"a-long-enough-secret\"\n",
            _ => "",
        };
        let file = dir.path().join(format!("{role}.toml"));
        std::fs::write(&file, base).unwrap();
        let out = run(&[role, "--check-config", file.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{role}: {stderr}");
        assert!(stderr.contains("insecure_plaintext"), "{role}: {stderr}");
        // Not only the check: the role itself does not start.
        let out = run(&[role, "--config", file.to_str().unwrap()]);
        assert_ne!(out.status.code(), Some(0), "{role} started in plaintext");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("insecure_plaintext"),
            "{role}"
        );
        std::fs::write(&file, format!("{base}insecure_plaintext = true\n")).unwrap();
        let out = run(&[role, "--check-config", file.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{role}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

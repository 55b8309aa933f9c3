use super::*;

fn load(dau: u64, regions: &[&str]) -> Load {
    Load {
        dau,
        messages_per_user: 60.0,
        factor: 1.0,
        peak_factor: 3.0,
        message_bytes: 1200,
        retention_days: 90,
        hot_days: 14,
        replicas: 1,
        file_share: 0.1,
        file_bytes: 200_000,
        downloads_per_file: 3.0,
        regions: regions.iter().map(|r| r.to_string()).collect(),
        cell_writes_per_s: DEFAULT_CELL_WRITES_PER_S,
        kafka: false,
    }
}

#[test]
fn the_worked_example_comes_out() {
    // 1M DAU × 60 messages a day, 1.2 KB each, kept 90 days, one copy.
    let plan = size(&load(1_000_000, &["eu-west-1"]));
    assert_eq!(plan.messages_per_day, 60e6);
    assert_eq!(plan.writes_per_s_average.round(), 694.0);
    assert_eq!(plan.writes_per_s_peak.round(), 2083.0);
    assert!(
        (plan.storage_bytes - 6.48e12).abs() < 1e6,
        "{}",
        plan.storage_bytes
    );
    // 14 of 90 days hot, the rest cold; together all of it.
    assert!((plan.hot_bytes + plan.cold_bytes - plan.storage_bytes).abs() < 1e6);
    assert!((plan.hot_bytes / plan.storage_bytes - 14.0 / 90.0).abs() < 1e-9);
    // 10% of messages with a 200 KB file, 90 days: 108 TB of files, the
    // bulk of what is stored; each downloaded 3 times: 3.6 TB a day.
    assert!(
        (plan.attachment_bytes - 108e12).abs() < 1e6,
        "{}",
        plan.attachment_bytes
    );
    assert!((plan.attachment_egress_bytes_per_day - 3.6e12).abs() < 1e6);
}

#[test]
fn cells_routers_and_partitions_follow_the_load() {
    let mut l = load(100_000_000, &["a", "b", "c", "d", "e"]);
    l.kafka = true;
    let plan = size(&l);
    // 100M × 60 / 86,400 × 3 ≈ 208,333 writes/s, 41,667 per region; a cell
    // planned at 1,000: 42 cells each.
    assert_eq!(plan.regions.len(), 5);
    for r in &plan.regions {
        assert_eq!(r.cells, 42);
        assert_eq!(r.kafka_partitions % r.cells, 0);
        assert!(r.kafka_partitions as f64 * PARTITION_WRITES_PER_S >= r.writes_per_s_peak);
    }
    // An odd group, one replica per region.
    assert_eq!(plan.router_replicas, 5);
    assert!(plan.regions.iter().all(|r| r.router_replicas == 1));
    // Four regions: five replicas, the first region holds two.
    let plan = size(&load(1_000, &["a", "b", "c", "d"]));
    assert_eq!(plan.router_replicas, 5);
    let per: Vec<u64> = plan.regions.iter().map(|r| r.router_replicas).collect();
    assert_eq!(per, vec![2, 1, 1, 1]);
    // A small load still gets two cells a region and three routers.
    let plan = size(&load(1_000, &["a"]));
    assert_eq!((plan.regions[0].cells, plan.router_replicas), (2, 3));
    assert_eq!(plan.regions[0].router_replicas, 3);
}

#[test]
fn a_load_no_plan_answers_is_refused_naming_the_flag() {
    let mut l = load(0, &["a"]);
    assert!(check(&l).unwrap_err().to_string().contains("--dau"));
    l.dau = 10;
    l.hot_days = 100;
    assert!(check(&l).unwrap_err().to_string().contains("--hot-days"));
    l.hot_days = 7;
    l.peak_factor = 0.5;
    assert!(check(&l).unwrap_err().to_string().contains("--peak-factor"));
    l.peak_factor = f64::NAN;
    assert!(check(&l).is_err());
    l.peak_factor = 2.0;
    l.regions = vec![];
    assert!(check(&l).unwrap_err().to_string().contains("--regions"));
}

#[test]
fn tfvars_name_every_region_with_its_size() {
    let l = load(100_000_000, &["eu-west-1", "us-east-1", "ap-southeast-1"]);
    let v = tfvars(&size(&l), &l);
    let regions = v["regions"].as_object().unwrap();
    assert_eq!(regions.len(), 3);
    assert!(regions["us-east-1"]["cells"].as_u64().unwrap() >= 2);
    assert_eq!(v["kafka"], false);
}

//! The plan as `terraform.tfvars.json` for `terraform/envs/example`: one
//! entry per region with its cells, router replicas, data volume and Kafka
//! partitions (the variable `regions` there), and whether Kafka is on.

use serde_json::{Value, json};

use super::{Load, Plan};

/// The variables of `terraform/envs/example` that `plan` sizes.
pub fn tfvars(plan: &Plan, load: &Load) -> Value {
    let regions: serde_json::Map<String, Value> = plan
        .regions
        .iter()
        .map(|r| {
            (
                r.name.clone(),
                json!({
                    "cells": r.cells,
                    "router_replicas": r.router_replicas,
                    "data_volume_gib": r.disk_gib_per_cell,
                    "kafka_partitions": r.kafka_partitions,
                }),
            )
        })
        .collect();
    json!({
        "regions": regions,
        "kafka": load.kafka,
    })
}

# The RoutingService replicas that live in one region. The group spans
# regions: every call gets the whole member list (node id, region, stable
# private name) and creates the members of its own region; the member with
# the lowest id bootstraps the group. Configs are the TOML `cellmesh
# router` validates (see ../config/router.toml.tftpl).

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

locals {
  bootstrap_id = min([for m in var.members : m.node_id]...)
  here         = { for m in var.members : tostring(m.node_id) => m if m.region == var.region }
}

module "config" {
  for_each  = local.here
  source    = "../config"
  role      = "router"
  telemetry = var.telemetry
  vars = {
    node_id   = each.value.node_id
    region    = each.value.region
    host      = each.value.host
    api_port  = var.api_port
    raft_port = var.raft_port
    bootstrap = each.value.node_id == local.bootstrap_id
    members   = var.members
  }
}

module "node" {
  for_each           = local.here
  source             = "../node"
  name               = "${var.deployment}-${var.region}-router-${each.key}"
  role               = "router"
  config             = module.config[each.key].toml
  host               = each.value.host
  zone_id            = var.zone_id
  instance_type      = var.instance_type
  ami_id             = var.ami_id
  subnet_id          = var.subnet_ids[tonumber(each.key) % length(var.subnet_ids)]
  security_group_ids = var.security_group_ids
  data_volume_gib    = var.data_volume_gib
  cellmesh_url       = var.cellmesh_url
  tls                = merge(var.tls, { stem = "router-${each.key}" })
}

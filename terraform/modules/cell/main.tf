# One cell: the whole message pipeline on one instance with a gp3 volume
# for RocksDB, registered in the region's private zone as
# cell-<name>.<region>.<domain>. Its config is the TOML `cellmesh cell`
# validates (see ../config/cell.toml.tftpl).

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

locals {
  host   = "cell-${var.name}.${var.zone_name}"
  config = module.config.toml
}

module "config" {
  source    = "../config"
  role      = "cell"
  telemetry = var.telemetry
  vars = {
    cell_id          = "${var.region}/${var.name}"
    instance_id      = var.instance_id
    port             = var.port
    advertise_host   = local.host
    routers          = var.routers
    etcd_endpoints   = var.etcd_endpoints
    kafka_brokers    = var.kafka_brokers
    kafka_partitions = var.kafka_partitions
  }
}

module "node" {
  source             = "../node"
  name               = "${var.deployment}-${var.region}-cell-${var.name}"
  role               = "cell"
  config             = local.config
  host               = local.host
  zone_id            = var.zone_id
  instance_type      = var.instance_type
  ami_id             = var.ami_id
  subnet_id          = var.subnet_id
  security_group_ids = var.security_group_ids
  data_volume_gib    = var.data_volume_gib
  cellmesh_url       = var.cellmesh_url
  tls                = merge(var.tls, { stem = "cell-${var.region}-${var.name}" })
}

# The control plane: replicas that elect an active one through etcd, probe
# the cells and fail them over, and run operators' moves. Config is the
# TOML `cellmesh control-plane` validates (see ../config/control-plane.toml.tftpl).

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

module "config" {
  count     = var.replicas
  source    = "../config"
  role      = "control-plane"
  telemetry = var.telemetry
  vars = {
    routers        = var.routers
    console_token  = var.console_token
    etcd_endpoints = var.etcd_endpoints
    console_port   = var.console_port
    admin_port     = var.admin_port
    name           = "control-plane-${count.index + 1}"
  }
}

module "node" {
  count              = var.replicas
  source             = "../node"
  name               = "${var.deployment}-${var.region}-control-plane-${count.index + 1}"
  role               = "control-plane"
  config             = module.config[count.index].toml
  host               = "control-plane-${count.index + 1}.${var.zone_name}"
  zone_id            = var.zone_id
  instance_type      = var.instance_type
  ami_id             = var.ami_id
  subnet_id          = var.subnet_ids[count.index % length(var.subnet_ids)]
  security_group_ids = var.security_group_ids
  cellmesh_url       = var.cellmesh_url
  tls                = merge(var.tls, { stem = "control-plane-${count.index + 1}" })
}

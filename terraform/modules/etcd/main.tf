# Three etcd members (cell leases and the control plane's election) with
# data volumes, named etcd-<n>.<region>.<domain>, configured through the
# environment file of the distribution's etcd package.

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

locals {
  hosts   = [for i in range(var.members) : "etcd-${i + 1}.${var.zone_name}"]
  cluster = join(",", [for i, h in local.hosts : "etcd-${i + 1}=http://${h}:${var.peer_port}"])
  configs = [
    for i, h in local.hosts : join("\n", [
      "ETCD_NAME=etcd-${i + 1}",
      "ETCD_DATA_DIR=/var/lib/cellmesh/etcd",
      "ETCD_LISTEN_CLIENT_URLS=http://0.0.0.0:${var.client_port}",
      "ETCD_ADVERTISE_CLIENT_URLS=http://${h}:${var.client_port}",
      "ETCD_LISTEN_PEER_URLS=http://0.0.0.0:${var.peer_port}",
      "ETCD_INITIAL_ADVERTISE_PEER_URLS=http://${h}:${var.peer_port}",
      "ETCD_INITIAL_CLUSTER=${local.cluster}",
      "ETCD_INITIAL_CLUSTER_STATE=new",
      "ETCD_INITIAL_CLUSTER_TOKEN=${var.deployment}",
    ])
  ]
}

module "node" {
  count              = var.members
  source             = "../node"
  name               = "${var.deployment}-${var.region}-etcd-${count.index + 1}"
  role               = "etcd"
  config             = local.configs[count.index]
  host               = local.hosts[count.index]
  zone_id            = var.zone_id
  instance_type      = var.instance_type
  ami_id             = var.ami_id
  subnet_id          = var.subnet_ids[count.index % length(var.subnet_ids)]
  security_group_ids = var.security_group_ids
  data_volume_gib    = var.data_volume_gib
  cellmesh_url       = var.cellmesh_url
}

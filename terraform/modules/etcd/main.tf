# Three etcd members (cell leases and the control plane's election) with
# data volumes, named etcd-<n>.<region>.<domain>, configured through the
# environment file of the distribution's etcd package: clients and peers
# over mutual TLS with the certificates `cellmesh pki issue-all` issued
# (etcd-<n>, naming the member's host).

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

locals {
  hosts   = [for i in range(var.members) : "etcd-${i + 1}.${var.zone_name}"]
  cluster = join(",", [for i, h in local.hosts : "etcd-${i + 1}=https://${h}:${var.peer_port}"])
  # Clients (cells, the control plane) and peers alike present a
  # certificate of the deployment's CA; the bundle is the node's secret.
  tls = [for k, v in {
    CERT_FILE            = "node.pem"
    KEY_FILE             = "node.key"
    TRUSTED_CA_FILE      = "ca.pem"
    CLIENT_CRL_FILE      = "crl.pem"
    PEER_CERT_FILE       = "node.pem"
    PEER_KEY_FILE        = "node.key"
    PEER_TRUSTED_CA_FILE = "ca.pem"
    PEER_CRL_FILE        = "crl.pem"
  } : "ETCD_${k}=/etc/cellmesh/tls/${v}"]
  configs = [
    for i, h in local.hosts : join("\n", concat([
      "ETCD_NAME=etcd-${i + 1}",
      "ETCD_DATA_DIR=/var/lib/cellmesh/etcd",
      "ETCD_LISTEN_CLIENT_URLS=https://0.0.0.0:${var.client_port}",
      "ETCD_ADVERTISE_CLIENT_URLS=https://${h}:${var.client_port}",
      "ETCD_LISTEN_PEER_URLS=https://0.0.0.0:${var.peer_port}",
      "ETCD_INITIAL_ADVERTISE_PEER_URLS=https://${h}:${var.peer_port}",
      "ETCD_INITIAL_CLUSTER=${local.cluster}",
      "ETCD_INITIAL_CLUSTER_STATE=new",
      "ETCD_INITIAL_CLUSTER_TOKEN=${var.deployment}",
      "ETCD_CLIENT_CERT_AUTH=true",
      "ETCD_PEER_CLIENT_CERT_AUTH=true",
    ], local.tls))
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
  tls                = merge(var.tls, { stem = "etcd-${count.index + 1}" })
}

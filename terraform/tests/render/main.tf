# Renders every role's config through modules/config with the values a
# three-region deployment gives it, for scripts/test-terraform.sh to check
# with `cellmesh <role> --check-config` (which loads each node's
# certificate from tls_dir). No provider, no resources.

variable "tls_dir" {
  description = "Certificates `cellmesh pki issue-all` issued for terraform/envs/example/tests/example.tfvars.json: each config names the one of its node, which --check-config loads and matches to the node."
  type        = string
}

locals {
  tls = { for stem in ["cell-eu-west-1-c1", "cell-us-east-1-c2", "router-1", "edge-us-east-1", "control-plane-1"] : stem => {
    ca_file   = "${var.tls_dir}/ca.pem"
    cert_file = "${var.tls_dir}/${stem}.pem"
    key_file  = "${var.tls_dir}/${stem}.key"
    crl_file  = "${var.tls_dir}/crl.pem"
  } }
  routers = ["http://router-1.eu-west-1.cellmesh.internal:7300", "http://router-2.us-east-1.cellmesh.internal:7300", "http://router-3.ap-southeast-1.cellmesh.internal:7300"]
  etcd    = ["https://etcd-1.eu-west-1.cellmesh.internal:2379", "https://etcd-2.eu-west-1.cellmesh.internal:2379", "https://etcd-3.eu-west-1.cellmesh.internal:2379"]
  members = [for i, r in ["eu-west-1", "us-east-1", "ap-southeast-1"] : { node_id = i + 1, region = r, host = "router-${i + 1}.${r}.cellmesh.internal" }]
}

module "cell_embedded" {
  source = "../../modules/config"
  tls    = local.tls["cell-eu-west-1-c1"]
  role   = "cell"
  telemetry = {
    otlp_endpoint = "http://collector.eu-west-1.cellmesh.internal:4317"
    sample_ratio  = 0.1
  }
  vars = {
    cell_id          = "eu-west-1/c1"
    instance_id      = 0
    port             = 7400
    advertise_host   = "cell-c1.eu-west-1.cellmesh.internal"
    routers          = local.routers
    etcd_endpoints   = local.etcd
    kafka_brokers    = ""
    kafka_partitions = 1
  }
}

module "cell_kafka" {
  source = "../../modules/config"
  tls    = local.tls["cell-us-east-1-c2"]
  role   = "cell"
  vars = {
    cell_id          = "us-east-1/c2"
    instance_id      = 101
    port             = 7400
    advertise_host   = "cell-c2.us-east-1.cellmesh.internal"
    routers          = local.routers
    etcd_endpoints   = local.etcd
    kafka_brokers    = "b-1.msk.example:9092,b-2.msk.example:9092"
    kafka_partitions = 84
  }
}

module "router" {
  source = "../../modules/config"
  tls    = local.tls["router-1"]
  role   = "router"
  vars = {
    node_id   = 1
    region    = "eu-west-1"
    host      = "router-1.eu-west-1.cellmesh.internal"
    api_port  = 7300
    raft_port = 7301
    bootstrap = true
    members   = local.members
  }
}

module "edge" {
  source = "../../modules/config"
  tls    = local.tls["edge-us-east-1"]
  role   = "edge"
  telemetry = {
    metrics_port  = 9465
    otlp_endpoint = "http://collector.us-east-1.cellmesh.internal:4317"
  }
  vars = {
    port         = 7200
    region       = "us-east-1"
    routers      = local.routers
    token_secret = "token-secret-of-the-test"
  }
}

module "control_plane" {
  source = "../../modules/config"
  tls    = local.tls["control-plane-1"]
  role   = "control-plane"
  vars = {
    routers        = local.routers
    console_token  = "console-token-of-the-test"
    etcd_endpoints = local.etcd
    console_port   = 7100
    admin_port     = 7101
    name           = "control-plane-1"
  }
}

output "configs" {
  value = {
    cell          = [module.cell_embedded.toml, module.cell_kafka.toml]
    router        = [module.router.toml]
    edge          = [module.edge.toml]
    control-plane = [module.control_plane.toml]
  }
  sensitive = true
}

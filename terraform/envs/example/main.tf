# Three regions (or up to six) from one variables file: per region a
# network, cells, router replicas, an edge and optionally Kafka; etcd and
# the control plane in the primary region; one latency-routed client name.
# Terraform binds providers statically, so every supported region has a
# provider alias and a module block that exists only when `regions` names
# it (see locals.supported).

terraform {
  required_version = ">= 1.6"
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

provider "aws" {
  region = var.primary_region
}

provider "aws" {
  alias  = "eu_west_1"
  region = "eu-west-1"
}

provider "aws" {
  alias  = "eu_central_1"
  region = "eu-central-1"
}

provider "aws" {
  alias  = "us_east_1"
  region = "us-east-1"
}

provider "aws" {
  alias  = "us_west_2"
  region = "us-west-2"
}

provider "aws" {
  alias  = "ap_southeast_1"
  region = "ap-southeast-1"
}

provider "aws" {
  alias  = "ap_northeast_1"
  region = "ap-northeast-1"
}

module "eu_west_1" {
  count            = contains(keys(var.regions), "eu-west-1") ? 1 : 0
  source           = "../../modules/region"
  providers        = { aws = aws.eu_west_1 }
  deployment       = var.deployment
  region           = "eu-west-1"
  spec             = local.specs["eu-west-1"]
  cidr             = local.cidrs["eu-west-1"]
  internal_cidrs   = local.internal_cidrs
  instance_id_base = 0
  routers          = local.router_endpoints
  router_members   = local.router_members
  etcd_endpoints   = local.etcd_endpoints
  tls              = local.tls
  token_secret     = var.token_secret
  ami_id           = var.ami_id
  cellmesh_url     = var.cellmesh_url
  telemetry        = var.telemetry
  monitoring_cidrs = var.monitoring_cidrs
}

module "eu_central_1" {
  count            = contains(keys(var.regions), "eu-central-1") ? 1 : 0
  source           = "../../modules/region"
  providers        = { aws = aws.eu_central_1 }
  deployment       = var.deployment
  region           = "eu-central-1"
  spec             = local.specs["eu-central-1"]
  cidr             = local.cidrs["eu-central-1"]
  internal_cidrs   = local.internal_cidrs
  instance_id_base = 100
  routers          = local.router_endpoints
  router_members   = local.router_members
  etcd_endpoints   = local.etcd_endpoints
  tls              = local.tls
  token_secret     = var.token_secret
  ami_id           = var.ami_id
  cellmesh_url     = var.cellmesh_url
  telemetry        = var.telemetry
  monitoring_cidrs = var.monitoring_cidrs
}

module "us_east_1" {
  count            = contains(keys(var.regions), "us-east-1") ? 1 : 0
  source           = "../../modules/region"
  providers        = { aws = aws.us_east_1 }
  deployment       = var.deployment
  region           = "us-east-1"
  spec             = local.specs["us-east-1"]
  cidr             = local.cidrs["us-east-1"]
  internal_cidrs   = local.internal_cidrs
  instance_id_base = 200
  routers          = local.router_endpoints
  router_members   = local.router_members
  etcd_endpoints   = local.etcd_endpoints
  tls              = local.tls
  token_secret     = var.token_secret
  ami_id           = var.ami_id
  cellmesh_url     = var.cellmesh_url
  telemetry        = var.telemetry
  monitoring_cidrs = var.monitoring_cidrs
}

module "us_west_2" {
  count            = contains(keys(var.regions), "us-west-2") ? 1 : 0
  source           = "../../modules/region"
  providers        = { aws = aws.us_west_2 }
  deployment       = var.deployment
  region           = "us-west-2"
  spec             = local.specs["us-west-2"]
  cidr             = local.cidrs["us-west-2"]
  internal_cidrs   = local.internal_cidrs
  instance_id_base = 300
  routers          = local.router_endpoints
  router_members   = local.router_members
  etcd_endpoints   = local.etcd_endpoints
  tls              = local.tls
  token_secret     = var.token_secret
  ami_id           = var.ami_id
  cellmesh_url     = var.cellmesh_url
  telemetry        = var.telemetry
  monitoring_cidrs = var.monitoring_cidrs
}

module "ap_southeast_1" {
  count            = contains(keys(var.regions), "ap-southeast-1") ? 1 : 0
  source           = "../../modules/region"
  providers        = { aws = aws.ap_southeast_1 }
  deployment       = var.deployment
  region           = "ap-southeast-1"
  spec             = local.specs["ap-southeast-1"]
  cidr             = local.cidrs["ap-southeast-1"]
  internal_cidrs   = local.internal_cidrs
  instance_id_base = 400
  routers          = local.router_endpoints
  router_members   = local.router_members
  etcd_endpoints   = local.etcd_endpoints
  tls              = local.tls
  token_secret     = var.token_secret
  ami_id           = var.ami_id
  cellmesh_url     = var.cellmesh_url
  telemetry        = var.telemetry
  monitoring_cidrs = var.monitoring_cidrs
}

module "ap_northeast_1" {
  count            = contains(keys(var.regions), "ap-northeast-1") ? 1 : 0
  source           = "../../modules/region"
  providers        = { aws = aws.ap_northeast_1 }
  deployment       = var.deployment
  region           = "ap-northeast-1"
  spec             = local.specs["ap-northeast-1"]
  cidr             = local.cidrs["ap-northeast-1"]
  internal_cidrs   = local.internal_cidrs
  instance_id_base = 500
  routers          = local.router_endpoints
  router_members   = local.router_members
  etcd_endpoints   = local.etcd_endpoints
  tls              = local.tls
  token_secret     = var.token_secret
  ami_id           = var.ami_id
  cellmesh_url     = var.cellmesh_url
  telemetry        = var.telemetry
  monitoring_cidrs = var.monitoring_cidrs
}

locals {
  supported = ["eu-west-1", "eu-central-1", "us-east-1", "us-west-2", "ap-southeast-1", "ap-northeast-1"]
  specs = {
    for r in local.supported : r => {
      cells                = try(var.regions[r].cells, 0)
      router_replicas      = try(var.regions[r].router_replicas, 0)
      data_volume_gib      = try(var.regions[r].data_volume_gib, 100)
      kafka_partitions     = var.kafka ? try(var.regions[r].kafka_partitions, 0) : 0
      cell_instance_type   = try(var.regions[r].cell_instance_type, "m6i.large")
      edge_certificate_arn = try(var.regions[r].edge_certificate_arn, "")
    }
  }
  cidrs          = { for i, r in local.supported : r => "10.${10 + i}.0.0/16" }
  names          = sort(keys(var.regions))
  internal_cidrs = [for r in local.names : local.cidrs[r]]
  # Router node ids count up over the regions in name order.
  router_members = flatten([
    for ri, r in local.names : [
      for k in range(var.regions[r].router_replicas) : {
        node_id = 1 + k + sum(concat([0], [for p in slice(local.names, 0, ri) : var.regions[p].router_replicas]))
        region  = r
        host    = "router-${1 + k + sum(concat([0], [for p in slice(local.names, 0, ri) : var.regions[p].router_replicas]))}.${r}.${var.internal_domain}"
      }
    ]
  ])
  router_endpoints = [for m in local.router_members : "http://${m.host}:7300"]
  # Known before anything exists (module etcd creates these names), so the
  # regions do not wait on etcd.
  etcd_endpoints = [for i in range(3) : "https://etcd-${i + 1}.${var.primary_region}.${var.internal_domain}:2379"]
  outputs = {
    "eu-west-1"      = one(module.eu_west_1)
    "eu-central-1"   = one(module.eu_central_1)
    "us-east-1"      = one(module.us_east_1)
    "us-west-2"      = one(module.us_west_2)
    "ap-southeast-1" = one(module.ap_southeast_1)
    "ap-northeast-1" = one(module.ap_northeast_1)
  }
  primary = local.outputs[var.primary_region]
  tls     = { dir = var.tls_dir, recovery_days = var.secret_recovery_days }
  # The file stem of every node's certificate in tls_dir, named as
  # `cellmesh pki issue-all` names them from the same variables.
  tls_stems = concat(
    [for m in local.router_members : "router-${m.node_id}"],
    [for r in local.names : "edge-${r}"],
    flatten([for r in local.names : [for c in range(var.regions[r].cells) : "cell-${r}-c${c + 1}"]]),
    [for i in range(var.control_plane_replicas) : "control-plane-${i + 1}"],
    [for i in range(3) : "etcd-${i + 1}"],
  )
  tls_missing = [for stem in local.tls_stems : stem if !fileexists("${var.tls_dir}/${stem}.pem") || !fileexists("${var.tls_dir}/${stem}.key")]
}

module "etcd" {
  source             = "../../modules/etcd"
  tls                = merge(local.tls, { kms_key_arn = local.primary.kms_key_arn })
  deployment         = var.deployment
  region             = var.primary_region
  zone_id            = local.primary.zone_id
  zone_name          = local.primary.zone_name
  subnet_ids         = local.primary.private_subnet_ids
  security_group_ids = [local.primary.internal_security_group_id]
  ami_id             = var.ami_id
  cellmesh_url       = var.cellmesh_url
}

module "control_plane" {
  source             = "../../modules/control-plane"
  deployment         = var.deployment
  region             = var.primary_region
  routers            = local.router_endpoints
  etcd_endpoints     = local.etcd_endpoints
  replicas           = var.control_plane_replicas
  tls                = merge(local.tls, { kms_key_arn = local.primary.kms_key_arn })
  console_token      = var.console_token
  zone_id            = local.primary.zone_id
  zone_name          = local.primary.zone_name
  subnet_ids         = local.primary.private_subnet_ids
  security_group_ids = [local.primary.internal_security_group_id, local.primary.metrics_security_group_id]
  telemetry          = var.telemetry
  ami_id             = var.ami_id
  cellmesh_url       = var.cellmesh_url
}

module "global_dns" {
  source  = "../../modules/global-dns"
  domain  = var.domain
  zone_id = var.public_zone_id
  edges   = { for r in local.names : r => local.outputs[r].edge }
}

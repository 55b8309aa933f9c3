# Everything cellmesh runs in one region: its network, its cells, the
# router replicas placed here, its edge, optionally its Kafka cluster, and
# the KMS key its nodes' certificate bundles are encrypted with.

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

locals {
  tls = merge(var.tls, { kms_key_arn = aws_kms_key.secrets.arn })
}

data "aws_caller_identity" "current" {}

# The key the region's certificate bundles are encrypted with. The key
# policy leaves access to IAM; each instance role may decrypt only
# through Secrets Manager, and only its own secret (see ../node/tls.tf).
resource "aws_kms_key" "secrets" {
  description             = "${var.deployment} ${var.region}: cellmesh certificate bundles"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "AccountAdministersThroughIam"
      Effect    = "Allow"
      Principal = { AWS = "arn:aws:iam::${data.aws_caller_identity.current.account_id}:root" }
      Action    = "kms:*"
      Resource  = "*"
    }]
  })
}

resource "aws_kms_alias" "secrets" {
  name          = "alias/${var.deployment}-${var.region}-tls"
  target_key_id = aws_kms_key.secrets.key_id
}

module "network" {
  source           = "../network"
  name             = var.deployment
  region           = var.region
  cidr             = var.cidr
  internal_cidrs   = var.internal_cidrs
  internal_domain  = var.internal_domain
  metrics_port     = try(var.telemetry.metrics_port, 9464)
  monitoring_cidrs = var.monitoring_cidrs
}

module "kafka" {
  source             = "../kafka"
  enabled            = var.spec.kafka_partitions > 0
  deployment         = var.deployment
  region             = var.region
  subnet_ids         = module.network.private_subnet_ids
  security_group_ids = [module.network.internal_security_group_id]
}

module "cell" {
  count              = var.spec.cells
  source             = "../cell"
  deployment         = var.deployment
  region             = var.region
  name               = "c${count.index + 1}"
  instance_id        = var.instance_id_base + count.index
  routers            = var.routers
  etcd_endpoints     = var.etcd_endpoints
  kafka_brokers      = module.kafka.bootstrap_brokers
  kafka_partitions   = max(var.spec.kafka_partitions, 1)
  zone_id            = module.network.zone_id
  zone_name          = module.network.zone_name
  instance_type      = var.spec.cell_instance_type
  ami_id             = var.ami_id
  subnet_id          = module.network.private_subnet_ids[count.index % 2]
  security_group_ids = [module.network.internal_security_group_id, module.network.metrics_security_group_id]
  telemetry          = var.telemetry
  data_volume_gib    = var.spec.data_volume_gib
  cellmesh_url       = var.cellmesh_url
  tls                = local.tls
}

module "routers" {
  source             = "../router-group"
  deployment         = var.deployment
  region             = var.region
  members            = var.router_members
  zone_id            = module.network.zone_id
  ami_id             = var.ami_id
  subnet_ids         = module.network.private_subnet_ids
  security_group_ids = [module.network.internal_security_group_id, module.network.metrics_security_group_id]
  telemetry          = var.telemetry
  cellmesh_url       = var.cellmesh_url
  tls                = local.tls
}

module "edge" {
  source              = "../edge"
  deployment          = var.deployment
  region              = var.region
  routers             = var.routers
  token_secret        = var.token_secret
  zone_id             = module.network.zone_id
  zone_name           = module.network.zone_name
  vpc_id              = module.network.vpc_id
  public_subnet_ids   = module.network.public_subnet_ids
  private_subnet_ids  = module.network.private_subnet_ids
  security_group_ids  = [module.network.edge_security_group_id, module.network.internal_security_group_id, module.network.metrics_security_group_id]
  telemetry           = var.telemetry
  ami_id              = var.ami_id
  cellmesh_url        = var.cellmesh_url
  tls                 = local.tls
  tls_certificate_arn = var.spec.edge_certificate_arn
}

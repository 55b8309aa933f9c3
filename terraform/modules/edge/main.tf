# A region's edge: stateless instances (private subnets) behind a network
# load balancer (public subnets) on the client port. Config is the TOML `cellmesh edge` validates (see
# ../config/edge.toml.tftpl).

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

locals {
  config = module.config.toml
}

module "config" {
  source    = "../config"
  role      = "edge"
  telemetry = var.telemetry
  vars = {
    port         = var.port
    region       = var.region
    routers      = var.routers
    token_secret = var.token_secret
  }
}

module "node" {
  count              = var.instances
  source             = "../node"
  name               = "${var.deployment}-${var.region}-edge-${count.index + 1}"
  role               = "edge"
  config             = local.config
  host               = "edge-${count.index + 1}.${var.zone_name}"
  zone_id            = var.zone_id
  instance_type      = var.instance_type
  ami_id             = var.ami_id
  subnet_id          = var.private_subnet_ids[count.index % length(var.private_subnet_ids)]
  security_group_ids = var.security_group_ids
  cellmesh_url       = var.cellmesh_url
  tls                = merge(var.tls, { stem = "edge-${var.region}" })
}

resource "aws_lb" "this" {
  name                             = substr("${var.deployment}-${var.region}-edge", 0, 32)
  load_balancer_type               = "network"
  subnets                          = var.public_subnet_ids
  enable_cross_zone_load_balancing = true
  enable_deletion_protection       = var.deletion_protection
}

resource "aws_lb_target_group" "this" {
  name        = substr("${var.deployment}-${var.region}-edge", 0, 32)
  port        = var.port
  protocol    = "TCP"
  vpc_id      = var.vpc_id
  target_type = "instance"
  health_check {
    protocol = "TCP"
  }
}

resource "aws_lb_target_group_attachment" "this" {
  count            = var.instances
  target_group_arn = aws_lb_target_group.this.arn
  target_id        = module.node[count.index].instance_id
  port             = var.port
}

resource "aws_lb_listener" "this" {
  load_balancer_arn = aws_lb.this.arn
  port              = var.port
  protocol          = var.tls_certificate_arn == "" ? "TCP" : "TLS"
  certificate_arn   = var.tls_certificate_arn == "" ? null : var.tls_certificate_arn
  ssl_policy        = var.tls_certificate_arn == "" ? null : "ELBSecurityPolicy-TLS13-1-2-2021-06"
  alpn_policy       = var.tls_certificate_arn == "" ? null : "HTTP2Preferred"
  default_action {
    type             = "forward"
    target_group_arn = aws_lb_target_group.this.arn
  }
}

# One client-facing name for the whole deployment: a Route53 latency
# record per region pointing at that region's edge load balancer, each
# with a TCP health check on the edge's port, so clients reach the nearest
# healthy region.

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

resource "aws_route53_zone" "this" {
  count = var.zone_id == "" ? 1 : 0
  name  = var.domain
}

locals {
  zone_id = var.zone_id != "" ? var.zone_id : aws_route53_zone.this[0].zone_id
}

resource "aws_route53_health_check" "edge" {
  for_each          = var.edges
  fqdn              = each.value.dns_name
  port              = each.value.port
  type              = "TCP"
  failure_threshold = 3
  request_interval  = 10
  tags              = { Name = "${var.name}-${each.key}-edge" }
}

resource "aws_route53_record" "edge" {
  for_each        = var.edges
  zone_id         = local.zone_id
  name            = "${var.name}.${var.domain}"
  type            = "CNAME"
  ttl             = 30
  records         = [each.value.dns_name]
  set_identifier  = each.key
  health_check_id = aws_route53_health_check.edge[each.key].id
  latency_routing_policy {
    region = each.key
  }
}

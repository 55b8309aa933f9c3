# Private reach between two regions: a VPC peering connection requested
# from one region and accepted in the other, routes to each other's
# address block from the private subnets, and each region's private zone
# associated with the other VPC, so a cell in one region resolves and
# reaches `router-1.<other region>.cellmesh.internal`.

terraform {
  required_providers {
    aws = {
      source                = "hashicorp/aws"
      version               = ">= 5.0"
      configuration_aliases = [aws.a, aws.b]
    }
  }
}

resource "aws_vpc_peering_connection" "this" {
  provider    = aws.a
  vpc_id      = var.a.vpc_id
  peer_vpc_id = var.b.vpc_id
  peer_region = var.b.region
  tags        = { Name = "${var.deployment}-${var.a.region}-${var.b.region}" }
}

resource "aws_vpc_peering_connection_accepter" "this" {
  provider                  = aws.b
  vpc_peering_connection_id = aws_vpc_peering_connection.this.id
  auto_accept               = true
}

resource "aws_route" "a_to_b" {
  provider                  = aws.a
  route_table_id            = var.a.route_table_id
  destination_cidr_block    = var.b.cidr
  vpc_peering_connection_id = aws_vpc_peering_connection.this.id
}

resource "aws_route" "b_to_a" {
  provider                  = aws.b
  route_table_id            = var.b.route_table_id
  destination_cidr_block    = var.a.cidr
  vpc_peering_connection_id = aws_vpc_peering_connection_accepter.this.id
}

resource "aws_route53_zone_association" "a_zone_in_b" {
  provider   = aws.a
  zone_id    = var.a.zone_id
  vpc_id     = var.b.vpc_id
  vpc_region = var.b.region
}

resource "aws_route53_zone_association" "b_zone_in_a" {
  provider   = aws.b
  zone_id    = var.b.zone_id
  vpc_id     = var.a.vpc_id
  vpc_region = var.a.region
}

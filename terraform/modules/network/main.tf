# One region's network: a VPC over two availability zones, public subnets
# (the edge's load balancer and the NAT gateway) and private ones (every
# instance; outbound through the NAT), security groups per role (internal
# ports only, each named), a default security group that allows nothing,
# and the region's private DNS zone where every process gets a stable name.

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

data "aws_availability_zones" "this" {
  state = "available"
}

locals {
  azs = length(var.zones) > 0 ? var.zones : slice(data.aws_availability_zones.this.names, 0, 2)
}

resource "aws_vpc" "this" {
  cidr_block           = var.cidr
  enable_dns_support   = true
  enable_dns_hostnames = true
  tags                 = { Name = "${var.name}-${var.region}" }
}

resource "aws_subnet" "public" {
  count                   = 2
  vpc_id                  = aws_vpc.this.id
  cidr_block              = cidrsubnet(var.cidr, 4, count.index)
  availability_zone       = local.azs[count.index]
  map_public_ip_on_launch = false
  tags                    = { Name = "${var.name}-${var.region}-public-${count.index}" }
}

resource "aws_subnet" "private" {
  count             = 2
  vpc_id            = aws_vpc.this.id
  cidr_block        = cidrsubnet(var.cidr, 4, count.index + 8)
  availability_zone = local.azs[count.index]
  tags              = { Name = "${var.name}-${var.region}-private-${count.index}" }
}

resource "aws_internet_gateway" "this" {
  vpc_id = aws_vpc.this.id
}

resource "aws_route_table" "public" {
  vpc_id = aws_vpc.this.id
  route {
    cidr_block = "0.0.0.0/0"
    gateway_id = aws_internet_gateway.this.id
  }
}

resource "aws_route_table_association" "public" {
  count          = 2
  subnet_id      = aws_subnet.public[count.index].id
  route_table_id = aws_route_table.public.id
}

# Instances have no public address: they reach the package mirrors and the
# binary's download through this.
resource "aws_eip" "nat" {
  domain = "vpc"
}

resource "aws_nat_gateway" "this" {
  allocation_id = aws_eip.nat.id
  subnet_id     = aws_subnet.public[0].id
  depends_on    = [aws_internet_gateway.this]
}

resource "aws_route_table" "private" {
  vpc_id = aws_vpc.this.id
  route {
    cidr_block     = "0.0.0.0/0"
    nat_gateway_id = aws_nat_gateway.this.id
  }
}

resource "aws_route_table_association" "private" {
  count          = 2
  subnet_id      = aws_subnet.private[count.index].id
  route_table_id = aws_route_table.private.id
}

resource "aws_default_security_group" "this" {
  vpc_id = aws_vpc.this.id
}

# Internal traffic: each component's port from the deployment's address
# blocks, nothing else.
resource "aws_security_group" "internal" {
  name        = "${var.name}-internal"
  description = "cellmesh components talking to each other"
  vpc_id      = aws_vpc.this.id
  dynamic "ingress" {
    for_each = var.internal_ports
    content {
      description = ingress.key
      from_port   = ingress.value[0]
      to_port     = ingress.value[1]
      protocol    = "tcp"
      cidr_blocks = var.internal_cidrs
    }
  }
  egress {
    description = "packages, the binary, other regions"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    cidr_blocks = ["0.0.0.0/0"]
  }
}

# Only the monitoring subnets scrape the metrics port (not even the other
# components: the internal group does not open it).
resource "aws_security_group" "metrics" {
  name        = "${var.name}-metrics"
  description = "Prometheus scraping cellmesh processes"
  vpc_id      = aws_vpc.this.id
  dynamic "ingress" {
    for_each = length(var.monitoring_cidrs) > 0 ? [var.metrics_port] : []
    content {
      description = "metrics scrape from the monitoring subnets"
      from_port   = ingress.value
      to_port     = ingress.value
      protocol    = "tcp"
      cidr_blocks = var.monitoring_cidrs
    }
  }
}

# Clients reach only the edge's port.
resource "aws_security_group" "edge" {
  name        = "${var.name}-edge"
  description = "clients to the cellmesh edge"
  vpc_id      = aws_vpc.this.id
  ingress {
    description = "client gRPC"
    from_port   = var.edge_port
    to_port     = var.edge_port
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }
  egress {
    description = "to the cells and routers"
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    cidr_blocks = ["0.0.0.0/0"]
  }
}

resource "aws_route53_zone" "private" {
  name = "${var.region}.${var.internal_domain}"
  vpc {
    vpc_id = aws_vpc.this.id
  }
}

# One region's network: a VPC over two availability zones, public subnets
# (the edge's load balancer) and private ones (cells, routers, etcd, the
# control plane), security groups per role, and the region's private DNS
# zone where every process gets a stable name.

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

data "aws_availability_zones" "this" {
  state = "available"
}

locals {
  azs = slice(data.aws_availability_zones.this.names, 0, 2)
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
  map_public_ip_on_launch = true
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

# Internal traffic: every cellmesh port from the deployment's address space.
resource "aws_security_group" "internal" {
  name        = "${var.name}-internal"
  description = "cellmesh components talking to each other"
  vpc_id      = aws_vpc.this.id
  ingress {
    description = "gRPC between components, etcd, admin"
    from_port   = var.ports.first
    to_port     = var.ports.last
    protocol    = "tcp"
    cidr_blocks = var.internal_cidrs
  }
  egress {
    from_port   = 0
    to_port     = 0
    protocol    = "-1"
    cidr_blocks = ["0.0.0.0/0"]
  }
}

# Clients reach only the edge's port.
resource "aws_security_group" "edge" {
  name        = "${var.name}-edge"
  description = "clients to the cellmesh edge"
  vpc_id      = aws_vpc.this.id
  ingress {
    description = "client gRPC"
    from_port   = var.ports.edge
    to_port     = var.ports.edge
    protocol    = "tcp"
    cidr_blocks = ["0.0.0.0/0"]
  }
  egress {
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

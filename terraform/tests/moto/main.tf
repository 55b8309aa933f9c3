# Applies modules/network and modules/global-dns against a local AWS API
# (moto_server on loopback, started by scripts/test-terraform.sh), which
# then checks with boto3 what exists, and destroys it.

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

variable "endpoint" {
  description = "The local AWS API, e.g. http://127.0.0.1:5000."
  type        = string
}

provider "aws" {
  region                      = "eu-west-1"
  access_key                  = "test"
  secret_key                  = "test"
  skip_credentials_validation = true
  skip_requesting_account_id  = true
  skip_metadata_api_check     = true
  endpoints {
    ec2     = var.endpoint
    route53 = var.endpoint
    sts     = var.endpoint
    iam     = var.endpoint
  }
}

module "network" {
  source         = "../../modules/network"
  name           = "moto"
  region         = "eu-west-1"
  cidr           = "10.10.0.0/16"
  internal_cidrs = ["10.10.0.0/16", "10.11.0.0/16"]
  # Prometheus scrapes from here only.
  monitoring_cidrs = ["10.10.200.0/24"]
}

module "global_dns" {
  source = "../../modules/global-dns"
  domain = "example.test"
  edges = {
    "eu-west-1" = { dns_name = "edge-eu.example.test", port = 7200 }
    "us-east-1" = { dns_name = "edge-us.example.test", port = 7200 }
  }
}

output "vpc_id" {
  value = module.network.vpc_id
}

output "zone_id" {
  value = module.global_dns.zone_id
}

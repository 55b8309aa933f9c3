# A three-region plan and the variables it refuses (mocked AWS provider).

mock_provider "aws" {
  source = "./tests/aws"
}

mock_provider "aws" {
  alias  = "eu_west_1"
  source = "./tests/aws"
}

mock_provider "aws" {
  alias  = "eu_central_1"
  source = "./tests/aws"
}

mock_provider "aws" {
  alias  = "us_east_1"
  source = "./tests/aws"
}

mock_provider "aws" {
  alias  = "us_west_2"
  source = "./tests/aws"
}

mock_provider "aws" {
  alias  = "ap_southeast_1"
  source = "./tests/aws"
}

mock_provider "aws" {
  alias  = "ap_northeast_1"
  source = "./tests/aws"
}

# The variables are tests/example.tfvars.json (scripts/test-terraform.sh
# passes it with -var-file, and tls_dir with the certificates `cellmesh pki
# issue-all` issued from the same file).

run "three_regions_plan_cells_routers_and_dns" {
  command = plan

  assert {
    condition     = length(output.cells) == 7
    error_message = "expected 7 cells over three regions"
  }
  assert {
    condition     = contains(output.cells, "us-east-1/c3") && contains(output.cells, "ap-southeast-1/c2")
    error_message = "cells are named <region>/c<n>"
  }
  assert {
    condition     = length(output.router_members) == 3 && length(distinct([for m in output.router_members : m.region])) == 3
    error_message = "one router replica per region"
  }
  assert {
    condition     = output.dns_records == 3
    error_message = "one latency record per region"
  }
  assert {
    condition     = output.peerings == 3
    error_message = "every pair of the three regions is peered"
  }
  assert {
    condition     = length(output.tls_identities) == 18 && contains(output.tls_identities, "cell-us-east-1-c3") && contains(output.tls_identities, "control-plane-2") && contains(output.tls_identities, "etcd-3")
    error_message = "every router, cell, edge, control-plane replica and etcd member has a certificate of its own"
  }
  assert {
    condition     = length(module.etcd.endpoints) == 3
    error_message = "three etcd members"
  }
  assert {
    condition     = length(module.eu_central_1) == 0 && length(module.us_east_1) == 1
    error_message = "only the regions named are deployed"
  }
}

run "no_cells_is_refused" {
  command = plan
  variables {
    regions = {
      "eu-west-1" = { cells = 0, router_replicas = 3 }
    }
  }
  expect_failures = [var.regions]
}

run "an_unknown_region_is_refused" {
  command = plan
  variables {
    regions = {
      "eu-west-1" = { cells = 2, router_replicas = 1 }
      "mars-1"    = { cells = 2, router_replicas = 2 }
    }
  }
  expect_failures = [var.regions]
}

run "an_even_router_count_is_refused" {
  command = plan
  variables {
    regions = {
      "eu-west-1" = { cells = 2, router_replicas = 2 }
      "us-east-1" = { cells = 2, router_replicas = 2 }
    }
  }
  expect_failures = [var.regions]
}

run "the_primary_region_must_be_deployed" {
  command = plan
  variables {
    primary_region = "us-west-2"
  }
  expect_failures = [var.primary_region]
}

run "telemetry_with_a_collector_and_a_monitoring_subnet_plans" {
  command = plan
  variables {
    telemetry        = { otlp_endpoint = "http://collector.eu-west-1.example:4317", sample_ratio = 0.2 }
    monitoring_cidrs = ["10.250.0.0/24"]
  }
  assert {
    condition     = length(output.cells) == 7
    error_message = "telemetry changes no placement"
  }
}

run "scraping_from_anywhere_is_refused" {
  command = plan
  variables {
    monitoring_cidrs = ["0.0.0.0/0"]
  }
  expect_failures = [var.monitoring_cidrs]
}

run "a_metrics_port_in_the_ephemeral_range_is_refused" {
  command = plan
  variables {
    telemetry = { metrics_port = 40000 }
  }
  expect_failures = [var.telemetry]
}

run "an_edge_load_balancer_terminating_tls_listens_with_tls" {
  command = plan
  variables {
    regions = {
      "eu-west-1"      = { cells = 2, router_replicas = 1, edge_certificate_arn = "arn:aws:acm:eu-west-1:123456789012:certificate/0f1e2d3c" }
      "us-east-1"      = { cells = 3, router_replicas = 1 }
      "ap-southeast-1" = { cells = 2, router_replicas = 1 }
    }
  }
  assert {
    condition     = module.eu_west_1[0].edge_listener_protocol == "TLS"
    error_message = "a region with a certificate terminates TLS at the load balancer"
  }
  assert {
    condition     = module.us_east_1[0].edge_listener_protocol == "TCP"
    error_message = "a region without one passes TCP through to its edges"
  }
}

run "an_edge_certificate_that_is_not_an_acm_arn_is_refused" {
  command = plan
  variables {
    regions = {
      "eu-west-1"      = { cells = 2, router_replicas = 1, edge_certificate_arn = "my-cert.pem" }
      "us-east-1"      = { cells = 3, router_replicas = 1 }
      "ap-southeast-1" = { cells = 2, router_replicas = 1 }
    }
  }
  expect_failures = [var.regions]
}

# The plan `cellmesh plan` sizes (see scripts/test-terraform.sh, which
# passes its tfvars with -var-file); it must plan cleanly.

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

run "plan_sized_by_cellmesh_plan" {
  command = plan

  assert {
    condition     = length(output.cells) == sum([for r in values(var.regions) : r.cells])
    error_message = "every planned cell is deployed"
  }
  assert {
    condition     = output.peerings == length(var.regions) * (length(var.regions) - 1) / 2
    error_message = "every pair of regions is peered"
  }
  assert {
    condition     = output.dns_records == length(var.regions)
    error_message = "one latency record per region"
  }
}

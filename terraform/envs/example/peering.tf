# Every pair of deployed regions is peered (Terraform binds providers
# statically: one block per pair of supported regions).

module "peering_eu_west_1_eu_central_1" {
  count      = alltrue([contains(keys(var.regions), "eu-west-1"), contains(keys(var.regions), "eu-central-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.eu_west_1, aws.b = aws.eu_central_1 }
  deployment = var.deployment
  a          = module.eu_west_1[0].peer
  b          = module.eu_central_1[0].peer
}

module "peering_eu_west_1_us_east_1" {
  count      = alltrue([contains(keys(var.regions), "eu-west-1"), contains(keys(var.regions), "us-east-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.eu_west_1, aws.b = aws.us_east_1 }
  deployment = var.deployment
  a          = module.eu_west_1[0].peer
  b          = module.us_east_1[0].peer
}

module "peering_eu_west_1_us_west_2" {
  count      = alltrue([contains(keys(var.regions), "eu-west-1"), contains(keys(var.regions), "us-west-2")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.eu_west_1, aws.b = aws.us_west_2 }
  deployment = var.deployment
  a          = module.eu_west_1[0].peer
  b          = module.us_west_2[0].peer
}

module "peering_eu_west_1_ap_southeast_1" {
  count      = alltrue([contains(keys(var.regions), "eu-west-1"), contains(keys(var.regions), "ap-southeast-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.eu_west_1, aws.b = aws.ap_southeast_1 }
  deployment = var.deployment
  a          = module.eu_west_1[0].peer
  b          = module.ap_southeast_1[0].peer
}

module "peering_eu_west_1_ap_northeast_1" {
  count      = alltrue([contains(keys(var.regions), "eu-west-1"), contains(keys(var.regions), "ap-northeast-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.eu_west_1, aws.b = aws.ap_northeast_1 }
  deployment = var.deployment
  a          = module.eu_west_1[0].peer
  b          = module.ap_northeast_1[0].peer
}

module "peering_eu_central_1_us_east_1" {
  count      = alltrue([contains(keys(var.regions), "eu-central-1"), contains(keys(var.regions), "us-east-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.eu_central_1, aws.b = aws.us_east_1 }
  deployment = var.deployment
  a          = module.eu_central_1[0].peer
  b          = module.us_east_1[0].peer
}

module "peering_eu_central_1_us_west_2" {
  count      = alltrue([contains(keys(var.regions), "eu-central-1"), contains(keys(var.regions), "us-west-2")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.eu_central_1, aws.b = aws.us_west_2 }
  deployment = var.deployment
  a          = module.eu_central_1[0].peer
  b          = module.us_west_2[0].peer
}

module "peering_eu_central_1_ap_southeast_1" {
  count      = alltrue([contains(keys(var.regions), "eu-central-1"), contains(keys(var.regions), "ap-southeast-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.eu_central_1, aws.b = aws.ap_southeast_1 }
  deployment = var.deployment
  a          = module.eu_central_1[0].peer
  b          = module.ap_southeast_1[0].peer
}

module "peering_eu_central_1_ap_northeast_1" {
  count      = alltrue([contains(keys(var.regions), "eu-central-1"), contains(keys(var.regions), "ap-northeast-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.eu_central_1, aws.b = aws.ap_northeast_1 }
  deployment = var.deployment
  a          = module.eu_central_1[0].peer
  b          = module.ap_northeast_1[0].peer
}

module "peering_us_east_1_us_west_2" {
  count      = alltrue([contains(keys(var.regions), "us-east-1"), contains(keys(var.regions), "us-west-2")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.us_east_1, aws.b = aws.us_west_2 }
  deployment = var.deployment
  a          = module.us_east_1[0].peer
  b          = module.us_west_2[0].peer
}

module "peering_us_east_1_ap_southeast_1" {
  count      = alltrue([contains(keys(var.regions), "us-east-1"), contains(keys(var.regions), "ap-southeast-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.us_east_1, aws.b = aws.ap_southeast_1 }
  deployment = var.deployment
  a          = module.us_east_1[0].peer
  b          = module.ap_southeast_1[0].peer
}

module "peering_us_east_1_ap_northeast_1" {
  count      = alltrue([contains(keys(var.regions), "us-east-1"), contains(keys(var.regions), "ap-northeast-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.us_east_1, aws.b = aws.ap_northeast_1 }
  deployment = var.deployment
  a          = module.us_east_1[0].peer
  b          = module.ap_northeast_1[0].peer
}

module "peering_us_west_2_ap_southeast_1" {
  count      = alltrue([contains(keys(var.regions), "us-west-2"), contains(keys(var.regions), "ap-southeast-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.us_west_2, aws.b = aws.ap_southeast_1 }
  deployment = var.deployment
  a          = module.us_west_2[0].peer
  b          = module.ap_southeast_1[0].peer
}

module "peering_us_west_2_ap_northeast_1" {
  count      = alltrue([contains(keys(var.regions), "us-west-2"), contains(keys(var.regions), "ap-northeast-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.us_west_2, aws.b = aws.ap_northeast_1 }
  deployment = var.deployment
  a          = module.us_west_2[0].peer
  b          = module.ap_northeast_1[0].peer
}

module "peering_ap_southeast_1_ap_northeast_1" {
  count      = alltrue([contains(keys(var.regions), "ap-southeast-1"), contains(keys(var.regions), "ap-northeast-1")]) ? 1 : 0
  source     = "../../modules/peering"
  providers  = { aws.a = aws.ap_southeast_1, aws.b = aws.ap_northeast_1 }
  deployment = var.deployment
  a          = module.ap_southeast_1[0].peer
  b          = module.ap_northeast_1[0].peer
}

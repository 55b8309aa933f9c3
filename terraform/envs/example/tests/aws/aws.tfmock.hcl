# What the mocked AWS provider answers for the data and resources whose
# values a plan reads.

mock_data "aws_availability_zones" {
  defaults = { names = ["zone-a", "zone-b", "zone-c"] }
}

mock_data "aws_ami" {
  defaults = { id = "ami-0123456789abcdef0" }
}

mock_resource "aws_route53_zone" {
  defaults = { zone_id = "Z0123456789", name = "zone.cellmesh.internal" }
}

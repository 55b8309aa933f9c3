# moto creates a zone with a VPC as a public zone and then refuses to
# associate it with another VPC: the applied copy leaves the association
# out (the plan tests keep it).
resource "aws_route53_zone_association" "a_zone_in_b" {
  count = 0
}

resource "aws_route53_zone_association" "b_zone_in_a" {
  count = 0
}

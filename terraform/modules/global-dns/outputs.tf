output "fqdn" {
  value = "${var.name}.${var.domain}"
}

output "zone_id" {
  value = local.zone_id
}

output "record_count" {
  value = length(aws_route53_record.edge)
}

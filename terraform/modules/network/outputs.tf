output "vpc_id" {
  value = aws_vpc.this.id
}

output "public_subnet_ids" {
  value = aws_subnet.public[*].id
}

output "private_subnet_ids" {
  value = aws_subnet.private[*].id
}

output "metrics_security_group_id" {
  value = aws_security_group.metrics.id
}

output "internal_security_group_id" {
  value = aws_security_group.internal.id
}

output "edge_security_group_id" {
  value = aws_security_group.edge.id
}

output "zone_id" {
  value = aws_route53_zone.private.zone_id
}

output "zone_name" {
  value = aws_route53_zone.private.name
}

output "cidr" {
  value = aws_vpc.this.cidr_block
}

output "private_route_table_id" {
  value = aws_route_table.private.id
}

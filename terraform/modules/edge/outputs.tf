output "lb_dns_name" {
  value = aws_lb.this.dns_name
}

output "lb_zone_id" {
  value = aws_lb.this.zone_id
}

output "port" {
  value = var.port
}

output "config" {
  value     = local.config
  sensitive = true
}

variable "deployment" {
  type = string
}

variable "a" {
  description = "The requesting region: its name, VPC, address block, private route table and private zone."
  type = object({
    region         = string
    vpc_id         = string
    cidr           = string
    route_table_id = string
    zone_id        = string
  })
}

variable "b" {
  description = "The accepting region (same fields)."
  type = object({
    region         = string
    vpc_id         = string
    cidr           = string
    route_table_id = string
    zone_id        = string
  })
}

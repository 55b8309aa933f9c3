variable "deployment" {
  type = string
}

variable "region" {
  type = string
}

variable "spec" {
  description = "This region's size (see envs/example variable regions)."
  type = object({
    cells                = number
    router_replicas      = number
    data_volume_gib      = number
    kafka_partitions     = number
    cell_instance_type   = string
    edge_certificate_arn = optional(string, "")
  })
}

variable "cidr" {
  type = string
}

variable "internal_cidrs" {
  type = list(string)
}

variable "internal_domain" {
  type    = string
  default = "cellmesh.internal"
}

variable "instance_id_base" {
  description = "The first cell's instance id; cells count up from it."
  type        = number
}

variable "routers" {
  type = list(string)
}

variable "router_members" {
  type = list(object({ node_id = number, region = string, host = string }))
}

variable "etcd_endpoints" {
  type = list(string)
}

variable "tls" {
  description = "The certificate bundles: the folder `cellmesh pki issue-all` wrote, and the recovery window of a deleted secret (days; 0: none). The region's own KMS key encrypts them."
  type = object({
    dir           = string
    recovery_days = optional(number, 7)
  })
}

variable "token_secret" {
  type      = string
  sensitive = true
}

variable "ami_id" {
  type    = string
  default = ""
}

variable "cellmesh_url" {
  type = string
}

variable "telemetry" {
  description = "Metrics port, OTLP endpoint and sample ratio of every process (see ../config)."
  type        = any
  default     = {}
}

variable "monitoring_cidrs" {
  description = "The monitoring subnets allowed to scrape `/metrics`."
  type        = list(string)
  default     = []
}

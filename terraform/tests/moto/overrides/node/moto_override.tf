# moto has no detailed monitoring (MonitorInstances is not implemented):
# the applied copy turns it off.
resource "aws_instance" "this" {
  monitoring = false
}

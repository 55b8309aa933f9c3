//! `cellmesh dev --kafka mock`: librdkafka's mock cluster (three brokers,
//! the real protocol on loopback ports) runs inside the dev process as the
//! cells' queue. Drills take brokers down and up through
//! `DATA_DIR/kafka.json` (`{"down": [1]}`; an empty list brings every
//! broker back).

use std::path::Path;

use anyhow::Context;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

pub use cellmesh_chaos::target::KAFKA_FILE;
const BROKERS: i32 = 3;

pub struct MockKafka {
    cluster: MockCluster<'static, DefaultProducerContext>,
    down: Vec<i32>,
}

impl MockKafka {
    pub fn start(data: &Path) -> anyhow::Result<Self> {
        // An outage left over from an interrupted drill does not outlive it.
        let _ = std::fs::remove_file(data.join(KAFKA_FILE));
        Ok(Self {
            cluster: MockCluster::new(BROKERS).context("cannot start the mock Kafka cluster")?,
            down: Vec::new(),
        })
    }

    pub fn bootstrap_servers(&self) -> String {
        self.cluster.bootstrap_servers()
    }

    pub fn create_topic(&self, topic: &str, partitions: u32) -> anyhow::Result<()> {
        self.cluster
            .create_topic(topic, partitions as i32, 1)
            .with_context(|| format!("cannot create topic {topic}"))
    }

    /// Takes brokers down or brings them back as `kafka.json` says.
    pub fn apply(&mut self, data: &Path) {
        let wanted: Vec<i32> = std::fs::read_to_string(data.join(KAFKA_FILE))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| serde_json::from_value(v["down"].clone()).ok())
            .unwrap_or_default();
        if wanted == self.down {
            return;
        }
        for id in 1..=BROKERS {
            let result = match (wanted.contains(&id), self.down.contains(&id)) {
                (true, false) => self.cluster.broker_down(id),
                (false, true) => self.cluster.broker_up(id),
                _ => continue,
            };
            if let Err(e) = result {
                println!("dev: kafka broker {id}: {e}");
            }
        }
        println!("dev: kafka brokers down now {wanted:?}");
        self.down = wanted;
    }
}
